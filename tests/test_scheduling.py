"""``--child-scheduling``: children, a zygote's workers and what they start run under
SCHED_BATCH by default (a woken child never preempts the supervisor), or under the normal
policy when told."""

from __future__ import annotations

import os
from typing import Any

import psutil
import psycopg

import atlantis
from tests.conftest import events, wait_for, wait_state


def _children(sup_pid: int, marker: str) -> list[psutil.Process]:
    found = []
    for c in psutil.Process(sup_pid).children():
        try:
            if marker in " ".join(c.cmdline()):
                found.append(c)
        except psutil.Error:
            continue
    return found


def test_reused_children_run_under_sched_batch_by_default(
    db: psycopg.Connection[Any], supervise: Any
) -> None:
    job = atlantis.enqueue(db, "tests.Echo", {"key": "batch", "value": "x"})
    sup = supervise(concurrency=2)
    wait_state(db, job, "complete")
    child = events(db, "batch")[0][3]
    assert os.sched_getscheduler(child) == os.SCHED_BATCH
    # Both children, each once the supervisor set its policy (right after starting it).
    wait_for(lambda: len(others := _children(sup.pid, "atlantis.child")) == 2
             and {os.sched_getscheduler(c.pid) for c in others} == {os.SCHED_BATCH},
             message="both children under SCHED_BATCH")
    assert os.sched_getscheduler(sup.pid) == os.SCHED_OTHER  # the supervisor keeps its own
    sup.stop()


def test_normal_scheduling_when_told(db: psycopg.Connection[Any], supervise: Any) -> None:
    job = atlantis.enqueue(db, "tests.Echo", {"key": "normal", "value": "x"})
    sup = supervise("--child-scheduling", "normal", concurrency=1)
    wait_state(db, job, "complete")
    assert os.sched_getscheduler(events(db, "normal")[0][3]) == os.SCHED_OTHER
    sup.stop()


def test_fresh_workers_inherit_the_zygotes_sched_batch(
    db: psycopg.Connection[Any], supervise: Any
) -> None:
    sup = supervise("--isolation", "fresh", concurrency=1)
    zygote = wait_for(lambda: _children(sup.pid, "atlantis.child.zygote"), message="a zygote")[0]
    # The supervisor sets it as soon as Popen returns: a loaded machine can show the zygote a
    # moment before that.
    wait_for(lambda: os.sched_getscheduler(zygote.pid) == os.SCHED_BATCH,
             message="the zygote under SCHED_BATCH")
    # A worker forked from it runs under it too (SCHED_RESET_ON_FORK is not set).
    worker = wait_for(lambda: [w for w in zygote.children()
                               if w.status() != psutil.STATUS_ZOMBIE], message="a warm worker")[0]
    assert os.sched_getscheduler(worker.pid) == os.SCHED_BATCH
    job = atlantis.enqueue(db, "tests.Echo", {"key": "fresh", "value": "x"})
    wait_state(db, job, "complete")
    sup.stop()
