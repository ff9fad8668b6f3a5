"""tests/apps/prune_old.py's release with a scheduled job, ``pruned.Nightly``, as well
(tests/test_sync_prune.py)."""

from __future__ import annotations

import atlantis

registry = atlantis.Registry.from_atl("prune_old.atl", "prune_sched.atl")

