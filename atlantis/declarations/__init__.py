"""Job and workflow declarations: the `.atl` language, its model, and the code generated
from it.

Each public name is imported on first use (PEP 562): a process that only needs the model,
or loads declarations an earlier process read (:mod:`decl_cache`), never imports the parser
and lark."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from atlantis.declarations.decl_cache import read_atl_file
    from atlantis.declarations.model import (
        BASE_TYPES,
        Declarations,
        Field,
        JobDecl,
        Limit,
        StepDecl,
        WorkflowDecl,
    )
    from atlantis.declarations.parser import parse_atl, parse_atl_file, read_atl

_HOMES = {
    "BASE_TYPES": "atlantis.declarations.model",
    "Declarations": "atlantis.declarations.model",
    "Field": "atlantis.declarations.model",
    "JobDecl": "atlantis.declarations.model",
    "Limit": "atlantis.declarations.model",
    "StepDecl": "atlantis.declarations.model",
    "WorkflowDecl": "atlantis.declarations.model",
    "parse_atl": "atlantis.declarations.parser",
    "parse_atl_file": "atlantis.declarations.parser",
    "read_atl": "atlantis.declarations.parser",
    "read_atl_file": "atlantis.declarations.decl_cache",
}

__all__ = [
    "BASE_TYPES", "Declarations", "Field", "JobDecl", "Limit", "StepDecl", "WorkflowDecl",
    "parse_atl", "parse_atl_file", "read_atl", "read_atl_file",
]  # fmt: skip


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
