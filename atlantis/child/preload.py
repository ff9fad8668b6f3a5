"""What a zygote loads for its workers once they turn out to need it.

A worker forked from the zygote lives for one attempt: a module it imports, it imports in
every attempt (psycopg and the step store some 60 ms, asyncio 20, psutil 15). Loaded in the
zygote, each is shared with every later worker instead. But what the zygote holds, every
fork copies (its page tables) and every worker's exit tears down: psycopg alone is half of a
zygote's heap, and a zygote that holds it forks and ends a worker some 15% dearer in CPU
(``benchmarks.compare``, fresh c4, 2026-12-07). So the zygote starts with the app alone, and
loads one of these only once a worker has needed it: the worker names, in its ``Done``, those
it imported during its attempt (:func:`imported_since`); the supervisor asks the zygote to
load them (a ``Preload`` packet), before any later fork, and asks every zygote it starts
later (a reload) at once.

Only these modules, whose import starts no thread and opens nothing: importing one of an
app's own modules in the zygote could (a connection made at import would then be shared by
every worker).
"""

from __future__ import annotations

import importlib
import sys

from atlantis.protocol.messages import Preloadable

#: Each name: the module whose presence says a worker needed it, and the one to import
#: for it (the step store, for psycopg: what handler steps import with it).
MODULES: dict[Preloadable, tuple[str, str]] = {
    "asyncio": ("asyncio", "asyncio"),  # an async handler's run (psycopg imports it too)
    "psutil": ("psutil", "psutil"),  # the sweep of an attempt that started processes
    "psycopg": ("psycopg", "atlantis.store.steps"),  # a handler's connection, handler steps
}


def loaded() -> frozenset[Preloadable]:
    """The names whose module this process has imported."""
    return frozenset(name for name, (seen, _) in MODULES.items() if seen in sys.modules)


def imported_since(before: frozenset[Preloadable]) -> list[Preloadable] | None:
    """The names imported since ``before`` (:func:`loaded` at the fork), sorted; None if none."""
    return sorted(loaded() - before) or None


def load(names: list[Preloadable]) -> None:
    """Import the modules of ``names`` (an unknown name is the caller's bug: KeyError)."""
    for name in names:
        importlib.import_module(MODULES[name][1])
