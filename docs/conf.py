"""The docs site: Sphinx with MyST (the pages are Markdown), built by ``./scripts/test`` with
warnings as errors, so that a broken link, a page missing from the navigation or a stale
reference to the API fails the suite.

    .venv/bin/sphinx-build -W --keep-going -b html docs docs/_build/html
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import atlantis  # noqa: E402  (after the path: the API reference documents this tree)

project = "atlantis"
author = "the atlantis authors"
copyright = "the atlantis authors"
release = atlantis.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.intersphinx",
    "sphinx_click",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_enable_extensions = ["deflist", "colon_fence"]
myst_heading_anchors = 3
html_theme = "furo"
html_title = f"atlantis {release}"
html_static_path: list[str] = []

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
# No default options: a directive documents members only when it lists them (`:members:`).
# (Sphinx 9 reads a default of {"members": False} as an empty list that wins over the
# directive's own :members:, so none would be shown.)
autodoc_default_options: dict[str, object] = {}
# No network while building: intersphinx has no inventories to fetch, so none are named.
intersphinx_mapping: dict[str, tuple[str, str | None]] = {}

#: Classes atlantis makes and hands to handlers, never built by users: their constructor's
#: parameters (internal fields included) are not shown; the reference lists their fields.
_NO_CONSTRUCTOR = frozenset({"atlantis.JobContext", "atlantis.AsyncJobContext",
                             "atlantis.Compensating"})


def _hide_constructor(app: Any, what: str, name: str, obj: Any, options: Any,
                      signature: str | None, return_annotation: str | None) -> Any:
    if what != "class" or name not in _NO_CONSTRUCTOR:
        return None
    # With autodoc_typehints = "description" the parameters' types were recorded before
    # this event; forget them, or they would be listed as the class's parameters.
    getattr(app.env.current_document, "autodoc_annotations", {}).pop(name, None)
    return "", None


def setup(app: Any) -> None:
    app.connect("autodoc-process-signature", _hide_constructor)
