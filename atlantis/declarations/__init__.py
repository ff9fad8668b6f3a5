"""Job and workflow declarations: the `.atl` language, its model, and the code generated
from it."""

from atlantis.declarations.model import (
    BASE_TYPES,
    Field,
    JobDecl,
    Limit,
    StepDecl,
    WorkflowDecl,
)
from atlantis.declarations.parser import (
    Declarations,
    parse_atl,
    parse_atl_file,
    read_atl,
    read_atl_file,
)

__all__ = [
    "BASE_TYPES", "Declarations", "Field", "JobDecl", "Limit", "StepDecl", "WorkflowDecl",
    "parse_atl", "parse_atl_file", "read_atl", "read_atl_file",
]  # fmt: skip
