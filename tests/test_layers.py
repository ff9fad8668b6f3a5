"""The import graph of ``atlantis/`` and ``benchmarks/``: no cycles, and no arrow downward-up.

Every module is parsed (never imported) and every ``import`` in it counts: at the top, in a
function (a lazy import still makes one module need the other), and under
``if TYPE_CHECKING:`` (a type named from a higher layer still ties the lower one to it).

An arrow goes to the module an import names: ``import a.b`` and ``from a.b import c`` point
to ``a.b``, or to ``a.b.c`` when that is a module of its own. The packages Python runs on
the way (``a/__init__.py`` before ``a.b``) are not counted: every module would otherwise
depend on its package, which imports its modules.

The layers, lowest first (``LAYERS``): the bottom modules, one above the other; the store;
the public API; the child; the lease keeper; then the supervisor, tide, the console and the framework
integrations side by side (the integrations use the public API; nothing imports them); the
test kit (``atlantis.testing``) above them all.
Nothing imports a layer above its own, no modules form a cycle, and no packages do
(``atlantis.store``, ``atlantis.cli``, ... and each module directly under ``atlantis/``,
each counted as one node). Every module of ``atlantis/`` must have a layer: a new package
or top-level module is placed here when it is added. The top layer's packages do not
import each other (tide adding the console's command aside), and no package imports
another's program entry module. benchmarks/ sits above it all.

Last, environment variable names: written as strings in ``atlantis/environ.py`` alone.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROOTS = ("atlantis", "benchmarks")

#: Lowest first; each entry is one layer, and names the packages and modules directly under
#: ``atlantis`` that it holds. ``atlantis`` itself (``atlantis/__init__.py``) is the public API.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "usage"),  # usage: one-line usage errors, for tide and atlantis-supervise
    ("units",),
    ("limits",),
    ("environ",),
    ("tracing",),  # OpenTelemetry, optional: imported only by a process that loaded it
    ("protocol",),
    ("declarations",),
    ("store",),
    ("", "enqueue", "operations", "workflows", "registry", "context", "steps", "steps_async", "children",
     "progress", "app", "presentation", "jobs", "scaling"),  # scaling: the gauges tide and the console serve
    ("child",),
    ("keeper",),  # the lease keeper: the child's tree-killing, run by a process of its own
    ("supervisor", "cli", "console", "integrations"),  # integrations: Django, SQLAlchemy
    ("testing",),  # the pytest plugin: drives supervisors, runs attempts as a child would
)
#: benchmarks/ sits above every layer of atlantis/.
BENCHMARKS_LAYER = len(LAYERS)

#: The top layer's packages stand side by side and do not import each other, but for this:
#: tide adds the console's command (``tide console``).
SIDEWAYS = frozenset({("atlantis.cli", "atlantis.console")})

#: The programs' entry modules (``pyproject.toml``'s scripts, ``python -m``): each is
#: imported by its own package alone. What another package needs of one lives in a module
#: of its own (the child's tree mark, say, in ``atlantis.child.tree``).
ENTRY_POINTS = frozenset({
    "atlantis.supervisor.cli", "atlantis.cli.tide", "atlantis.child.main",
    "atlantis.child.__main__", "atlantis.console.__main__", "atlantis.keeper.main",
    "atlantis.keeper.__main__",
})

#: An environment variable's name as a string: written in ``atlantis/environ.py`` alone.
ENV_NAME = re.compile(r"ATLANTIS_[A-Z_]+")


@dataclass(frozen=True)
class Arrow:
    """``source`` imports ``target`` at ``where`` (``path:line``)."""

    source: str
    target: str
    where: str


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def module_files() -> dict[str, Path]:
    """Every module of atlantis/ and benchmarks/ by dotted name."""
    found = {}
    for root in ROOTS:
        for path in sorted((ROOT / root).rglob("*.py")):
            found[module_name(path)] = path
    return found


MODULES = module_files()


def is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def resolve(name: str, level: int, base: str) -> str:
    """The absolute name of a relative import (``from .x import y`` in module ``base``)."""
    if level == 0:
        return name
    parts = base.split(".")
    if not is_package(base):
        parts.pop()
    parts = parts[: len(parts) - (level - 1)] if level > 1 else parts
    return ".".join([*parts, name] if name else parts)


def known(name: str) -> str | None:
    """``name``, or the nearest enclosing module of ours; None for another project's."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def arrows_of(source: str) -> Iterator[Arrow]:
    path = MODULES[source]
    tree = ast.parse(path.read_text(), str(path))
    shown = path.relative_to(ROOT)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = resolve(node.module or "", node.level, source)
            for alias in node.names:
                whole = f"{base}.{alias.name}"
                targets.append(whole if whole in MODULES else base)
        for target in targets:
            ours = known(target)
            if ours is not None and ours != source:
                yield Arrow(source, ours, f"{shown}:{node.lineno}")


ARROWS = sorted({arrow for source in MODULES for arrow in arrows_of(source)},
                key=lambda a: (a.source, a.target, a.where))


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] == "benchmarks":
        return BENCHMARKS_LAYER
    top = parts[1] if len(parts) > 1 else ""
    for rank, names in enumerate(LAYERS):
        if top in names:
            return rank
    return None


def unit_of(module: str) -> str:
    """The package-level node: ``atlantis.store`` for ``atlantis.store.admin``."""
    return ".".join(module.split(".")[:2])


def cycles(arrows: list[tuple[str, str, str]]) -> list[list[tuple[str, str, str]]]:
    """Every strongly connected group of two or more nodes, as the arrows inside it."""
    graph: dict[str, set[str]] = {}
    for source, target, _ in arrows:
        graph.setdefault(source, set()).add(target)
        graph.setdefault(target, set())
    # Tarjan's algorithm, iterative.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(group)
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return [[a for a in arrows if a[0] in g and a[1] in g] for g in groups]


def describe(groups: list[list[tuple[str, str, str]]]) -> str:
    lines = []
    for group in groups:
        nodes = sorted({a[0] for a in group})
        lines.append("cycle among " + ", ".join(nodes) + ":")
        lines += [f"  {where}: {source} -> {target}" for source, target, where in sorted(group)]
    return "\n".join(lines)


def test_every_module_of_atlantis_has_a_layer() -> None:
    unplaced = sorted(m for m in MODULES if m.startswith("atlantis") and layer_of(m) is None)
    assert not unplaced, f"place these in tests/test_layers.py LAYERS: {unplaced}"


def test_the_walk_sees_lazy_and_relative_imports() -> None:
    """The graph is read from the source: a lazy import in a function makes an arrow."""
    lazy = [a for a in ARROWS if a.source == "atlantis.console.command"
            and a.target == "atlantis.console.app"]
    assert lazy, "console/command.py imports the console's app inside its command"
    assert resolve("b", 2, "atlantis.store.admin") == "atlantis.b"
    assert resolve("", 1, "atlantis.store") == "atlantis.store"


def test_no_arrow_from_a_lower_layer_to_a_higher_one() -> None:
    upward = []
    for arrow in ARROWS:
        low, high = layer_of(arrow.source), layer_of(arrow.target)
        if low is not None and high is not None and high > low:
            upward.append(f"  {arrow.where}: {arrow.source} (layer {low}) imports "
                          f"{arrow.target} (layer {high})")
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(sorted(upward))


def test_the_top_layer_stands_side_by_side() -> None:
    """The supervisor, tide and the console share what lies below them, not each other."""
    top = LAYERS[-1]
    sideways = [f"  {a.where}: {a.source} imports {a.target}" for a in ARROWS
                if layer_of(a.source) == layer_of(a.target) == len(LAYERS) - 1
                and unit_of(a.source) != unit_of(a.target)
                and (unit_of(a.source), unit_of(a.target)) not in SIDEWAYS]
    assert not sideways, f"imports between {', '.join(top)}:\n" + "\n".join(sideways)


def test_entry_points_are_imported_by_their_own_package_alone() -> None:
    outside = [f"  {a.where}: {a.source} imports {a.target}" for a in ARROWS
               if a.target in ENTRY_POINTS and unit_of(a.source) != unit_of(a.target)]
    assert not outside, "a program's entry module imported from outside:\n" + "\n".join(outside)


def test_no_import_cycle_between_modules() -> None:
    found = cycles([(a.source, a.target, a.where) for a in ARROWS])
    assert not found, "import cycles between modules:\n" + describe(found)


def test_no_import_cycle_between_packages() -> None:
    units = [(unit_of(a.source), unit_of(a.target), a.where) for a in ARROWS
             if unit_of(a.source) != unit_of(a.target)]
    found = cycles(units)
    assert not found, "import cycles between packages:\n" + describe(found)


def test_cycles_are_found_and_named() -> None:
    arrows = [("a", "b", "a.py:1"), ("b", "c", "b.py:2"), ("c", "a", "c.py:3"),
              ("c", "d", "c.py:4"), ("d", "e", "d.py:5"), ("e", "d", "e.py:6")]
    found = sorted(sorted(a[0] for a in group) for group in cycles(arrows))
    assert found == [["a", "b", "c"], ["d", "e"]]
    assert "c.py:3: c -> a" in describe(cycles(arrows))


def environ_literals(path: Path) -> Iterator[tuple[int, str]]:
    """Strings in ``path`` naming an environment variable, docstrings aside."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            docstrings.add(id(node.value))  # an attribute's docstring (``#:`` style aside)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in docstrings):
            match = ENV_NAME.search(node.value)
            if match:
                yield node.lineno, match.group()


def test_environment_variable_names_are_written_in_environ_alone() -> None:
    """Code names an environment variable through ``atlantis.environ`` (text shown to a
    person may too, with an f-string); docstrings and comments may spell it out."""
    found = [f"  {path.relative_to(ROOT)}:{line}: {name}"
             for module, path in MODULES.items()
             if module.startswith("atlantis") and module != "atlantis.environ"
             for line, name in environ_literals(path)]
    assert not found, "use atlantis.environ's constants:\n" + "\n".join(found)


def test_no_module_of_atlantis_is_over_400_lines() -> None:
    """A module past 400 lines holds more than one concept: split it along them."""
    long = [f"  {path.relative_to(ROOT)}: {n} lines"
            for module, path in MODULES.items() if module.startswith("atlantis")
            for n in [len(path.read_text().splitlines())] if n > 400]
    assert not long, "split these along their concepts:\n" + "\n".join(long)
