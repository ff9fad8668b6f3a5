"""The package as people adopt it: CONTRIBUTING.md's Layout table matches the tree, the version is
written once and read from the installed distribution, CHANGELOG.md names each release's
schema version, and a LICENSE ships. No database: these read files and metadata only."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import atlantis

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "atlantis"
MIGRATIONS = PACKAGE / "store" / "migrations"

_CODE = re.compile(r"`([^`]+)`")


def _layout() -> list[tuple[list[str], list[str]]]:
    """The rows of CONTRIBUTING.md's Layout table: (paths named in the first cell, names in the
    second)."""
    text = (ROOT / "CONTRIBUTING.md").read_text("utf-8")
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 2, line
        rows.append((_CODE.findall(cells[0]), _CODE.findall(cells[1])))
    assert rows, "CONTRIBUTING.md has no Layout table"
    return rows


def _exists(path: str) -> bool:
    if "*" in path:
        return any(ROOT.glob(path))
    return (ROOT / path).exists()


def test_every_path_of_the_layout_table_exists() -> None:
    missing = [path for paths, _ in _layout() for path in paths if not _exists(path)]
    assert not missing, f"CONTRIBUTING.md's Layout names paths that do not exist: {missing}"


def test_the_files_a_package_row_names_exist_in_that_package() -> None:
    """A row for a folder may name its modules and SQL files (`claimer.py`): each one must be
    somewhere under that folder, so that a module renamed or moved shows up here."""
    stale = []
    for paths, names in _layout():
        folders = [ROOT / p for p in paths if p.endswith("/")]
        if not folders:
            continue
        for name in names:
            if "/" in name or " " in name or not re.search(r"\.(py|sql|lark|md)$", name):
                continue
            if not any(next(folder.rglob(name), None) for folder in folders):
                stale.append(f"{name} (row {paths})")
    assert not stale, f"CONTRIBUTING.md's Layout names files that are not there: {stale}"


def test_every_top_level_package_and_module_of_atlantis_is_in_the_layout() -> None:
    named = {path.rstrip("/") for paths, _ in _layout() for path in paths}
    entries = sorted(
        f"atlantis/{entry.name}"
        for entry in PACKAGE.iterdir()
        if (entry.is_dir() and (entry / "__init__.py").exists())
        or (entry.suffix == ".py" and entry.name != "__init__.py")
    )
    assert len(entries) > 10
    missing = [entry for entry in entries if entry not in named]
    assert not missing, f"CONTRIBUTING.md's Layout does not name: {missing}"


def test_the_version_is_read_from_the_installed_distribution() -> None:
    installed = metadata.version("atlantis-jobs")
    assert atlantis.__version__ == installed
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]["version"]
    # An editable install reads pyproject.toml when it is (re)installed: a mismatch here means
    # the virtualenv is stale (./scripts/test reinstalls when pyproject.toml changes).
    assert installed == declared


def _schema_versions() -> dict[str, int]:
    """CHANGELOG.md: each release's version and the schema version its section names."""
    text = (ROOT / "CHANGELOG.md").read_text("utf-8")
    sections = re.split(r"^## ", text, flags=re.MULTILINE)[1:]
    found = {}
    for section in sections:
        version = section.split(None, 1)[0]
        schema = re.search(r"Schema version: \*\*(\d{4})\*\*", section)
        assert schema, f"CHANGELOG.md: release {version} names no schema version"
        found[version] = int(schema.group(1))
    return found


def test_the_changelog_names_this_release_and_its_schema_version() -> None:
    releases = _schema_versions()
    assert atlantis.__version__ in releases, f"CHANGELOG.md has no section {atlantis.__version__}"
    newest = max(int(path.name[:4]) for path in MIGRATIONS.glob("[0-9][0-9][0-9][0-9]_*.sql"))
    assert releases[atlantis.__version__] == newest, (
        f"CHANGELOG.md says {atlantis.__version__} ships schema version "
        f"{releases[atlantis.__version__]:04d}; the newest migration is {newest:04d}")
    # Newest first, and a release never ships an older schema than the one before it.
    schemas = list(releases.values())
    assert schemas == sorted(schemas, reverse=True), releases


def test_a_license_file_ships() -> None:
    text = (ROOT / "LICENSE").read_text("utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    installed = metadata.metadata("atlantis-jobs")
    assert installed.get_all("License-Expression") == ["Apache-2.0"]
    assert installed.get_all("License-File") == ["LICENSE"]


def test_import_atlantis_is_lazy_and_every_name_and_submodule_still_answers() -> None:
    """``import atlantis`` imports no part of atlantis until a name is used (the lease keeper
    and children pay only for what they use); every public name, ``__version__`` and every
    submodule (``atlantis.operations.set_queue_limit``) still answer; the module
    ``atlantis.enqueue`` never hides the function ``atlantis.enqueue``."""
    script = """
import sys, atlantis
loaded = sorted(m for m in sys.modules if m.startswith("atlantis."))
assert loaded == [], loaded
assert callable(atlantis.operations.set_queue_limit)
import atlantis.enqueue
from atlantis.enqueue import EnqueueOptions
assert callable(atlantis.enqueue) and atlantis.enqueue.__name__ == "enqueue", atlantis.enqueue
assert all(getattr(atlantis, n) is not None for n in atlantis.__all__)
assert atlantis.__version__ and "checkpoint" in dir(atlantis)
try:
    atlantis.no_such_name
except AttributeError as exc:
    assert "no_such_name" in str(exc)
else:
    raise AssertionError("no AttributeError")
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr
