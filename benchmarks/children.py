"""Children (issue 35): a fan-out of ``ctx.spawn`` calls and a ``ctx.join`` against the
same jobs enqueued and drained plainly, and a 10,000-child fan-out, with one real supervisor
on scratch databases of the embedded server.

    python -m benchmarks.children [--children 1000] [--rounds 5] [--big 10000]
        [--concurrency 8] [--parts pairs,big,spawn]

Every part starts ``atlantis-supervise --queue bench --app benchmarks.children_app:registry
--isolation reuse --concurrency 8`` and stops it by its pid; the jobs are
``benchmarks/children_app.py``'s (``fan.Child`` returns ``3 * i + 1``; ``fan.Parent``
spawns ``n`` of them, one ``ctx.spawn`` each, and joins them; ``fan.ParentMany`` the same
by ``ctx.spawn_many``).

1. **pairs**: on one database and one supervisor (warmed by one small run of each, not
   counted), rounds taking turns: (a) **plain**: ``--children`` ``fan.Child`` put by
   ``atlantis.enqueue_many`` in one transaction, from just before the enqueue to the last
   one's ``finished_at``; (b) **fan-out**: one ``fan.Parent`` spawning as many, from just
   before its enqueue to its ``finished_at``. Both by PostgreSQL's clock; a ``CHECKPOINT``
   before each. Target: b at most 1.5x a (the median of the rounds' ratios). Two
   diagnostics in each round: (c) ``fan.SpawnOnly``, the same spawns onto a queue nobody
   serves and no join (the spawn loop with no drain beside it). (d) **spawn_many**: one
   ``fan.ParentMany``, the same children by one ``ctx.spawn_many`` (one fenced statement,
   one step), then the same join; target: d at most 1.5x a too. Rounds run a b c d,
   d c b a, .... CPU (psutil) of the supervisor,
   its children and the database's backends (the enqueuing connection's included; this
   script's polling one not) per child job; the runs' phases by their rows' and records'
   timestamps.
2. **big**: one ``fan.Parent`` of ``--big`` children on a fresh database: its total time,
   the spawn rate (first spawn's record to the last's), and checks: exactly that many
   children, all complete, each spawned once, and the join's result right (count, sum,
   order), the parent on its first attempt. Then, on the same database, one
   ``fan.ParentMany`` of as many (one ``ctx.spawn_many`` call), with the same checks (its
   one record's ids the children): its wake and resume after a join of that size.
3. **spawn**: what one spawn costs, from this process on a job row set running by hand
   (nothing else running): ``atlantis.step_spawn`` autocommit as a handler sends it; the
   same with ``synchronous_commit = off`` (the WAL flush's share); the same inside one
   transaction (the statement and its round trip, no commit), with the server's time in
   ``step_fence`` and ``enqueue_many`` (``track_functions``); ``EXPLAIN ANALYZE``'s
   execution time; floors: ``atlantis.record_step`` autocommit, and ``enqueue_many``'s cost
   a row in one batch.

Benchmarks, not tests: nothing is asserted; a target not met is printed as **missed**.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

from benchmarks.children_floors import spawn_part
from benchmarks.children_parts import LOGS, Bench, Run, big_part, header, say, warm
from benchmarks.scratch import scratch_database
from benchmarks.steps_harness import verdict
from benchmarks.tables import markdown


def cpu_ms(run: Run, jobs: int, split: bool = False) -> str:
    w, c, s = (x / jobs * 1000 for x in (run.cpu.worker, run.cpu.children, run.cpu.store))
    return f"{w + c + s:.3f}" + (f" ({w:.3f} / {c:.3f} / {s:.3f})" if split else "")


def median(runs: list[Run], get: Callable[[Run], float], spec: str = ".3f") -> str:
    return format(statistics.median(get(r) for r in runs), spec)


KINDS = {"plain": "(a) plain", "fan": "(b) fan-out", "alone": "(c) spawns alone",
         "many": "(d) spawn_many"}


def one(bench: Bench, which: str, n: int) -> Run:
    if which == "plain":
        return bench.plain(n)
    if which == "alone":
        return bench.spawn_only(n)
    return bench.fan_out(n, "fan.Parent" if which == "fan" else "fan.ParentMany")


def pairs_part(children: int, rounds: int, concurrency: int) -> list[str]:
    runs: dict[str, list[Run]] = {k: [] for k in KINDS}
    with scratch_database("atl_children") as url, Bench(url, concurrency) as bench:
        warm(bench, min(children, 200))
        for r in range(rounds):
            for which in list(KINDS) if r % 2 == 0 else list(reversed(KINDS)):
                run = one(bench, which, children)
                runs[which].append(run)
                say(f"round {r + 1}: {which} {run.seconds:.3f} s"
                    + (f" ({run.note})" if run.note else ""))
    plain, fan, alone, many = (runs[k] for k in KINDS)
    ratios = [b.seconds / a.seconds for a, b in zip(plain, fan, strict=True)]
    manies = [d.seconds / a.seconds for a, d in zip(plain, many, strict=True)]
    rows = [["round", "(a) plain s", "(b) fan-out s", "**ratio b/a**", "(c) spawns alone s",
             "(d) spawn_many s", "**ratio d/a**", "CPU ms/job (a)", "(b)", "(c)", "(d)"]]
    for r, (a, b, c, d) in enumerate(zip(plain, fan, alone, many, strict=True)):
        rows.append([f"{r + 1} ({'a b c d' if r % 2 == 0 else 'd c b a'})",
                     f"{a.seconds:.3f}", f"{b.seconds:.3f}", f"{ratios[r]:.2f}x",
                     f"{c.seconds:.3f}", f"{d.seconds:.3f}", f"{manies[r]:.2f}x",
                     *(cpu_ms(x, children) for x in (a, b, c, d))])

    def cpu(got: list[Run]) -> str:
        return f"**{median(got, lambda x: x.cpu_total() / children * 1000)}**"

    def secs(got: list[Run]) -> str:
        return f"**{median(got, lambda x: x.seconds)}**"

    med = statistics.median(ratios)
    rows.append(["**median**", secs(plain), secs(fan), f"**{med:.2f}x**", secs(alone),
                 secs(many), f"**{statistics.median(manies):.2f}x**",
                 *(cpu(runs[k]) for k in KINDS)])
    split = [["CPU ms a child job (the median round's)", "supervisor / its children / "
              "PostgreSQL"]]
    for kind, label in KINDS.items():
        mid = sorted(runs[kind], key=lambda x: x.cpu_total())[len(runs[kind]) // 2]
        split.append([label, cpu_ms(mid, children, split=True)])
    notes = [f"{children:,} children a run, {rounds} rounds, `--concurrency {concurrency} "
             f"--isolation reuse`. Target: ≤ 1.5x plain (the median ratio): one `ctx.spawn` "
             f"a child (b/a) {verdict(med <= 1.5)}; `ctx.spawn_many` (d/a) "
             f"{verdict(statistics.median(manies) <= 1.5)} (rounds ≤ 1.5x: "
             f"{sum(x <= 1.5 for x in manies)} of {rounds}). Diagnostic: (c) the same spawns "
             "by `fan.SpawnOnly` onto a queue nobody serves, no join (the spawn loop with no "
             "drain beside it).",
             markdown(split), phases_table(runs, children)]
    bad = [x.note for got in runs.values() for x in got if x.note]
    notes.append("Every run's jobs complete, every join's result right." if not bad else
                 "**Not all complete:** " + "; ".join(bad))
    return ["### fan-out and join against a plain enqueue and drain", markdown(rows), *notes]


def phases_table(runs: dict[str, list[Run]], n: int) -> str:
    """The medians, over the rounds, of each run's phases."""
    def med(kind: str, end: str, begin: str | None = None) -> str:
        got = [r.phases[end] - (r.phases[begin] if begin else 0.0) for r in runs[kind]
               if end in r.phases and (begin is None or begin in r.phases)]
        return f"{statistics.median(got):.3f} s" if got else ""

    fans = ("fan", "alone", "many")
    suspended = [sum(1 for r in runs[k] if "resumed" in r.phases) for k in ("fan", "many")]
    done_by = [statistics.median(r.phases.get("done_by_last_spawn", 0) for r in runs[k])
               for k in ("fan", "many")]
    rows = [["phase (median of the rounds)", *KINDS.values()],
            ["just before the enqueue → its commit (plain: the batch; else: the parent)",
             *(med(k, "enqueued") for k in KINDS)],
            ["→ the first child claimed / the first spawn recorded", med("plain", "first"),
             *(med(k, "first_spawn") for k in fans)],
            ["first spawn → last spawn recorded (d: the one call)", "",
             *(med(k, "last_spawn", "first_spawn") for k in fans)],
            ["children finished by the last spawn", "", f"{done_by[0]:,.0f} of {n:,}",
             "none (nobody serves them)", f"{done_by[1]:,.0f} of {n:,}"],
            ["last spawn → join recorded", "", med("fan", "joined", "last_spawn"), "",
             med("many", "joined", "last_spawn")],
            ["first claim → last child finished (plain: the drain)",
             med("plain", "last", "first"), "", "", ""],
            ["join recorded → last child finished", "", med("fan", "last_child", "joined"),
             "", med("many", "last_child", "joined")],
            ["joins that suspended the parent", "", f"{suspended[0]} of {len(runs['fan'])}",
             "", f"{suspended[1]} of {len(runs['many'])}"],
            ["of those: last child's end → parent claimed again (wake)", "",
             med("fan", "resumed", "last_child"), "", med("many", "resumed", "last_child")],
            ["of those: parent claimed again → complete (records read, replay, join read)",
             "", med("fan", "done", "resumed"), "", med("many", "done", "resumed")],
            ["**total**: just before the enqueue → done", *(med(k, "done") for k in KINDS)]]
    return markdown(rows)


PARTS = ("pairs", "big", "spawn")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.children",
                                     description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--children", type=int, default=1000, help="children a paired run")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (a b c d, d c b a, ...)")
    parser.add_argument("--big", type=int, default=10000, help="children of the big fan-out")
    parser.add_argument("--spawns", type=int, default=2000, help="spawns of each spawn floor")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--parts", default=",".join(PARTS), help="of " + ",".join(PARTS))
    opts = parser.parse_args(argv)
    parts = [p.strip() for p in opts.parts.split(",") if p.strip()]
    if set(parts) - set(PARTS):
        parser.error(f"--parts: {', '.join(sorted(set(parts) - set(PARTS)))} is not one of "
                     + ", ".join(PARTS))
    if min(opts.children, opts.rounds, opts.big, opts.spawns, opts.concurrency) < 1:
        parser.error("every count must be at least 1")
    out: list[str] = []
    if "pairs" in parts:
        out += pairs_part(opts.children, opts.rounds, opts.concurrency)
    if "big" in parts:
        out += big_part(opts.big, opts.concurrency)
    if "spawn" in parts:
        out += spawn_part(opts.spawns)
    print("\n" + header() + "\n")
    print("\n\n".join(out))
    print(f"\nsupervisor logs: {LOGS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
