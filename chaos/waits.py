"""The durable waits of the chaos run (issue 35): ``chaos.Waiter`` and ``chaos.Fan``, what the
run reads of them, and their three checks.

A waiter (chaos/app.py) waits for the event ``first`` under the step ``on-first``, then for
``second`` under ``on-second``; the driver (chaos/sender.py) sends each waiter one event of
each name, on its own connection, at random times (some before the job reaches its wait,
some after), each payload ``{"nonce": <unique>}``, and notes each send (:class:`Sent`). A
fan-out spawns ``n`` leaves (``leaf-<i>``) and joins them (``all``); a leaf's value is its
own job id, and the fan-out returns ``{"values": [...], "sum": ...}``. The history, beside
the events every handler records (its executions named by the claim's run id):

- ``wait:<step>`` before a wait, ``got:<step>:<nonce>`` once it returned, ``suspend`` when
  a run ends at a wait or a join; ``spawned:<step>:<id>`` after a spawn returned;
- atlantis's own records: ``atlantis.job_events`` (each event, whether and by which wait it
  was consumed), the wait, spawn and join records of ``atlantis.job_steps``, each job's
  ``parent_id`` and result.

The promises (``ctx.wait_for_event``, ``ctx.spawn``, ``ctx.join``):

- every event consumed once: each event the run sent is stored under the id it got back;
  one sent to a job that completed was consumed, and the payload of each consumed one is
  held by exactly one wait record of its job, the one that consumed it; each delivered wait
  holds the payload of an event sent to it under its name; a completed waiter received
  both; every run that got a payload got the one its wait recorded;
- every join saw all its children: a completed fan-out's children all completed, its join's
  record lists exactly its children (``parent_id``), as many as it planned, and it returned
  their values in the join's order;
- no child spawned twice: for every parent, its children are exactly the jobs its spawn
  records name, one record each (a child no record names was spawned twice), and every run
  got back the id its spawn recorded.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

    from chaos.check import History, Result

WAITER, FAN, LEAF = "chaos.Waiter", "chaos.Fan", "chaos.Leaf"
EVENTS = ("first", "second")
"""What a waiter waits for, in order; the wait for ``e`` is the step ``on-e``."""
JOIN = "all"


def step(event: str) -> str:
    return f"on-{event}"


@dataclass(frozen=True)
class Sent:
    """An event the driver sent (or tried to): ``event_id`` is what ``send_event`` returned,
    None when it was refused (the job had ended)."""

    job_id: int
    event: str
    nonce: str
    event_id: int | None


@dataclass(frozen=True)
class EventRow:
    """One row of ``atlantis.job_events``."""

    id: int
    job_id: int
    event: str
    nonce: str | None
    consumed: bool
    consumed_by: str | None = None


@dataclass(frozen=True)
class WaitRecord:
    """A wait's record in ``atlantis.job_steps``; ``nonce`` None while it waits."""

    job_id: int
    name: str
    event: str
    nonce: str | None
    delivered: bool


@dataclass(frozen=True)
class SpawnRecord:
    job_id: int
    name: str
    child: int


@dataclass
class WaitHistory:
    waiters: set[int] = field(default_factory=set)
    """Job ids of the ``chaos.Waiter`` rows."""
    fans: dict[int, int] = field(default_factory=dict)
    """Job id of each ``chaos.Fan`` -> how many leaves it spawns."""
    sent: list[Sent] = field(default_factory=list)
    rows: list[EventRow] = field(default_factory=list)
    waits: list[WaitRecord] = field(default_factory=list)
    spawns: list[SpawnRecord] = field(default_factory=list)
    joins: dict[int, list[int]] = field(default_factory=dict)
    """Fan-out -> the ids its join ``all`` recorded."""
    results: dict[int, Any] = field(default_factory=dict)
    """Result of each fan-out and each child."""


def read(conn: psycopg.Connection[Any], sent: list[Sent]) -> WaitHistory:
    waiters = {int(r[0]) for r in conn.execute(
        "SELECT id FROM atlantis.jobs WHERE job = %s", (WAITER,)).fetchall()}
    fans = {int(r[0]): int(r[1]) for r in conn.execute(
        "SELECT id, (args->>'n')::int FROM atlantis.jobs WHERE job = %s", (FAN,)).fetchall()}
    rows = [EventRow(*r) for r in conn.execute(
        "SELECT id, job_id, event, payload->>'nonce', consumed_at IS NOT NULL, consumed_by "
        "  FROM atlantis.job_events ORDER BY id").fetchall()]
    waits = [WaitRecord(*r) for r in conn.execute(
        "SELECT job_id, name, value->>'event', value->'payload'->>'nonce', value ? 'payload' "
        "  FROM atlantis.job_steps WHERE kind = 'event' ORDER BY job_id, name").fetchall()]
    spawns = [SpawnRecord(*r) for r in conn.execute(
        "SELECT job_id, name, (value->>'job')::bigint FROM atlantis.job_steps "
        " WHERE kind = 'spawn' ORDER BY job_id, name").fetchall()]
    joins = {int(r[0]): [int(i) for i in r[1]] for r in conn.execute(
        "SELECT job_id, value->'ids' FROM atlantis.job_steps WHERE kind = 'join' AND name = %s",
        (JOIN,)).fetchall()}
    results = {int(r[0]): r[1] for r in conn.execute(
        "SELECT id, result FROM atlantis.jobs WHERE job = %s OR parent_id IS NOT NULL",
        (FAN,)).fetchall()}
    return WaitHistory(waiters, fans, list(sent), rows, waits, spawns, joins, results)


def _result(name: str, bad: list[str], detail: str) -> Result:
    from chaos.check import EXAMPLES, Result  # chaos.check imports this module

    return Result(name, not bad, detail, tuple(bad[:EXAMPLES]))


def _marks(h: History, prefix: str) -> list[tuple[int, str, str, str]]:
    """(job, run, step, value) of each ``<prefix><step>:<value>`` event of the history."""
    out = []
    for e in h.events:
        if e.event.startswith(prefix):
            name, _, value = e.event[len(prefix):].rpartition(":")
            out.append((e.job_id, e.run, name, value))
    return out


def _suspended_at(h: History) -> set[tuple[int, str]]:
    """(job, step) of each wait a run of the job ended at (``wait:<step>``, then
    ``suspend``): its event had not come yet."""
    runs: dict[str, list[str]] = defaultdict(list)
    jobs: dict[str, int] = {}
    for e in sorted(h.events, key=lambda e: e.at):
        runs[e.run].append(e.event)
        jobs[e.run] = e.job_id
    return {(jobs[run], evs[-2][len("wait:"):]) for run, evs in runs.items()
            if len(evs) >= 2 and evs[-1] == "suspend" and evs[-2].startswith("wait:")}


def _sends(h: History, complete: set[int]) -> tuple[list[str], int]:
    """Each sent event against its row and the wait records: (wrongs, consumed once)."""
    w = h.waits
    rows = {r.id: r for r in w.rows}
    holders: dict[tuple[int, str], list[str]] = defaultdict(list)
    for r in w.waits:
        if r.delivered and r.nonce is not None:
            holders[(r.job_id, r.nonce)].append(r.name)
    bad: list[str] = []
    once = 0
    for s in w.sent:
        if s.event_id is None:
            if s.job_id in complete:
                bad.append(f"job {s.job_id} complete, yet its event {s.event} was refused")
            continue
        row = rows.get(s.event_id)
        if row is None or (row.job_id, row.event, row.nonce) != (s.job_id, s.event, s.nonce):
            bad.append(f"job {s.job_id}: event {s.event} (id {s.event_id}, nonce {s.nonce}) "
                       f"sent, but not stored so")
            continue
        held = holders.get((s.job_id, s.nonce), [])
        if s.job_id in complete and not row.consumed:
            bad.append(f"job {s.job_id} complete, its event {s.event} (id {s.event_id}) never "
                       f"consumed")
        elif row.consumed and held != [row.consumed_by]:
            bad.append(f"job {s.job_id}: event {s.event} (id {s.event_id}) consumed by "
                       f"{row.consumed_by}, its payload held by wait(s) "
                       f"{', '.join(held) or '-'}")
        elif not row.consumed and held:
            bad.append(f"job {s.job_id}: event {s.event} (id {s.event_id}) not consumed, yet "
                       f"delivered to {', '.join(held)}")
        else:
            once += row.consumed
    ids = {s.event_id for s in w.sent}
    bad += [f"job {r.job_id}: event {r.event} (id {r.id}) stored, never sent by the run"
            for r in w.rows if r.job_id in w.waiters and r.id not in ids]
    return bad, once


def _waits(h: History, complete: set[int]) -> list[str]:
    """Each wait record against the events sent; each run's payload against its record."""
    w = h.waits
    sent = {(s.job_id, s.nonce): s for s in w.sent if s.event_id is not None}
    records = {(r.job_id, r.name): r for r in w.waits}
    bad: list[str] = []
    for r in w.waits:
        s = sent.get((r.job_id, r.nonce or ""))
        if r.delivered and (s is None or step(s.event) != r.name or s.event != r.event):
            bad.append(f"job {r.job_id}: wait {r.name} holds payload {r.nonce}, which the run "
                       f"did not send it as {r.event}")
    for job in sorted(complete):
        lost = [step(e) for e in EVENTS if not getattr(records.get((job, step(e))),
                                                       "delivered", False)]
        bad += [f"job {job} complete, wait {n} never received its event" for n in lost]
    for job, run, name, nonce in _marks(h, "got:"):
        held = records.get((job, name))
        if held is None or held.nonce != nonce:
            bad.append(f"job {job}: run {run} received {nonce} at wait {name}, whose record "
                       f"holds {held.nonce if held else '(none)'}")
    return bad


def check_events(h: History) -> Result:
    w = h.waits
    complete = {j.id for j in h.jobs if j.id in w.waiters and j.state == "complete"}
    bad, once = _sends(h, complete)
    bad += _waits(h, complete)
    delivered = [r for r in w.waits if r.delivered]
    late = _suspended_at(h)
    waited = sum(1 for r in delivered if (r.job_id, r.name) in late)
    refused = sum(1 for s in w.sent if s.event_id is None)
    return _result("every event consumed once", bad,
                   f"{len(w.sent)} events sent to {len(w.waiters)} waiters ({refused} refused: "
                   f"the job had ended), {once} consumed once; {len(delivered)} waits "
                   f"delivered: {len(delivered) - waited} found their event sent, {waited} "
                   f"suspended until it came; {len(bad)} wrong")


def _children(h: History) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = defaultdict(list)
    for j in h.jobs:
        if j.parent_id is not None:
            kids[j.parent_id].append(j.id)
    return kids


def check_joins(h: History) -> Result:
    w = h.waits
    kids = _children(h)
    states = {j.id: j.state for j in h.jobs}
    done = sorted(j.id for j in h.jobs if j.id in w.fans and j.state == "complete")
    bad: list[str] = []
    for fan in done:
        children = kids.get(fan, [])
        behind = [f"{c} {states[c]}" for c in children if states[c] != "complete"]
        if behind:
            bad.append(f"job {fan} complete, its child(ren) {', '.join(behind)}")
        joined = w.joins.get(fan)
        if joined is None:
            bad.append(f"job {fan} complete, no join recorded")
            continue
        if sorted(joined) != sorted(children) or len(children) != w.fans[fan]:
            bad.append(f"job {fan}: its join lists {joined}, its children are "
                       f"{sorted(children)} ({w.fans[fan]} planned)")
        values = [w.results.get(c) for c in joined]
        want = {"values": values, "sum": sum(v for v in values if isinstance(v, int))}
        if w.results.get(fan) != want:
            bad.append(f"job {fan} returned {w.results.get(fan)}, its children returned "
                       f"{values}")
    fans = Counter(j.state for j in h.jobs if j.id in w.fans)
    n_kids = sum(len(kids.get(f, [])) for f in w.fans)
    return _result("every join saw all its children", bad,
                   f"{len(w.fans)} fan-outs: {fans['complete']} complete, {fans['dead']} dead, "
                   f"{fans['cancelled']} cancelled; {n_kids} children, {len(bad)} wrong")


def check_spawns(h: History) -> Result:
    kids = _children(h)
    records: dict[int, dict[str, int]] = defaultdict(dict)
    for s in h.waits.spawns:
        records[s.job_id][s.name] = s.child
    bad: list[str] = []
    for parent in sorted(set(kids) | set(records)):
        children, named = set(kids.get(parent, [])), records.get(parent, {})
        if len(children) != len(named):
            bad.append(f"job {parent}: {len(children)} children, {len(named)} spawn records")
        bad += [f"job {parent}: child {c} named by none of its spawn records (spawned twice?)"
                for c in sorted(children - set(named.values()))]
        bad += [f"job {parent}: spawn {n} records job {c}, not a child of it"
                for n, c in sorted(named.items()) if c not in children]
        twice = [c for c, k in Counter(named.values()).items() if k > 1]
        bad += [f"job {parent}: job {c} recorded by more than one spawn" for c in twice]
    got = _marks(h, "spawned:")
    for job, run, name, child in got:
        if str(records.get(job, {}).get(name)) != child:
            bad.append(f"job {job}: run {run} got job {child} from spawn {name}, whose record "
                       f"holds {records.get(job, {}).get(name)}")
    return _result("no child spawned twice", bad,
                   f"{sum(len(r) for r in records.values())} spawns recorded by "
                   f"{len(records)} parents, {sum(len(k) for k in kids.values())} children, "
                   f"{len(got)} spawns returned in runs; {len(bad)} wrong")


def checks(h: History) -> list[Result]:
    return [check_events(h), check_joins(h), check_spawns(h)]
