"""An app with a workflow and no handlers: what `tide db sync` stores (declaration tests)."""

from __future__ import annotations

import atlantis

registry = atlantis.Registry.from_atl("decl_flows.atl")
