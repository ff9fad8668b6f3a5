"""``atlantis.testing``: test handlers with the real semantics (a pytest plugin, enabled by
the package's ``pytest11`` entry point; docs/howto/test-handlers.md).

* fixtures ``atlantis_db`` (a fresh database per test, migrated, the app's declarations
  synced: :class:`TestDatabase`, a ``str`` of its URL), ``atlantis_conn`` (an autocommit
  connection to it) and ``atlantis_app`` (the app: ``--atlantis-app``, the ini option
  ``atlantis_app``, or your own fixture);
* :func:`run_inline`: one attempt of a handler in the test's process, with a real context;
* :func:`drain`: the enqueued jobs through a real ``atlantis-supervise`` until idle;
* :func:`assert_idempotent`: run it twice, and once more killed at each kill point;
* :func:`wake`: suspended jobs (sleeps, waits, joins) run now.

Names are imported on first use: the plugin's load imports nothing of atlantis.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from atlantis.testing.database import TestDatabase
    from atlantis.testing.idempotent import assert_idempotent
    from atlantis.testing.inline import InlineRun, run_inline
    from atlantis.testing.supervised import JobEnd, drain, wake

_HOMES = {
    "TestDatabase": "atlantis.testing.database",
    "JobEnd": "atlantis.testing.supervised",
    "drain": "atlantis.testing.supervised",
    "wake": "atlantis.testing.supervised",
    "assert_idempotent": "atlantis.testing.idempotent",
    "InlineRun": "atlantis.testing.inline",
    "run_inline": "atlantis.testing.inline",
}

__all__ = ["InlineRun", "JobEnd", "TestDatabase", "assert_idempotent", "drain", "run_inline",
           "wake"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'atlantis.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
