"""Job declarations: the `.atl` language, its model, and the code generated from it."""

from atlantis.declarations.model import BASE_TYPES, Field, JobDecl
from atlantis.declarations.parser import parse_atl, parse_atl_file

__all__ = ["BASE_TYPES", "Field", "JobDecl", "parse_atl", "parse_atl_file"]
