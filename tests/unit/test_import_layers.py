"""Imports go one way: no circles in linkpassd/ or labs/, and each part
imports only the parts below it (docs/layers.md has the picture).

The graph is read from the source with ast, not by importing it, and counts
every import, those inside functions too (an import moved into a function to
dodge a circle is still the circle). Importing `a.b.c` also runs the
`__init__` of every package on the way (`a`, `a.b`) that the importer is not
already inside, so those count as imports of it too; importing names from
one's own package (`from a import x` inside a.b) counts as importing `a`.
Imports under `if TYPE_CHECKING:` count too: they never run, but a module
that names another's class depends on it all the same, so two modules that
annotate each other are a circle (a collaborator that needs a little of its
owner says so with a Protocol of its own instead).
"""

from __future__ import annotations

import ast
import functools
import pathlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

REPO = pathlib.Path(__file__).resolve().parents[2]
ROOTS = ("linkpassd", "labs")

# Each part of the code, by module name prefix (the longest prefix wins).
PARTS: dict[str, str] = {
    "linkpassd.core": "core",
    "linkpassd._proto": "proto",
    "linkpassd": "shared",  # the package's own __init__ only: __version__
    "linkpassd.logs": "shared",
    "linkpassd.timefmt": "shared",
    "linkpassd.exitcodes": "shared",
    "linkpassd.fleet": "shared",
    "linkpassd.data": "shared",
    "linkpassd.config": "config",
    "linkpassd.adapters": "adapters",
    # the responder process is the other half of adapters.responderproc
    "linkpassd.responder": "adapters",
    "linkpassd.validate": "validate",
    # the programs
    "linkpassd.daemon": "daemon",
    "linkpassd.metrics_snapshot": "daemon",
    "linkpassd.agent": "daemon",
    "linkpassd.aggregator": "aggregator",
    "linkpassd.ctl": "ctl",
    "labs": "labs",
}

# What each part may import besides itself. Programs (daemon, aggregator,
# ctl, labs) never import each other, except labs, which runs them all; below
# them, each layer imports only layers further down.
_BASE = {"core", "proto", "shared"}
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "proto": set(),
    "shared": {"proto"},
    "config": {"core", "proto", "shared"},
    "adapters": {"core", "proto", "shared"},
    "validate": {"core", "proto", "shared"},
    "daemon": _BASE | {"config", "adapters"},
    "aggregator": _BASE | {"config", "adapters", "validate"},
    "ctl": _BASE | {"config", "adapters", "validate"},
    "labs": _BASE | {"config", "adapters", "validate", "daemon", "aggregator", "ctl"},
}
PROGRAMS = ("daemon", "aggregator", "ctl", "labs")


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    where: str  # file:line
    type_only: bool  # under `if TYPE_CHECKING:`


# --------------------------------------------------------------------------
# the graph, from source
# --------------------------------------------------------------------------


def find_modules(root: pathlib.Path, packages: Iterable[str] = ROOTS) -> dict[str, pathlib.Path]:
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the nodes inside `if TYPE_CHECKING:` (or typing.TYPE_CHECKING) bodies."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else (
                test.attr if isinstance(test, ast.Attribute) else "")
            if name == "TYPE_CHECKING":
                for child in node.body:
                    inside.update(id(n) for n in ast.walk(child))
    return inside


def _imported_names(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """Dotted names an import statement asks for (a `from X import y`
    gives both X.y, in case y is a module, and X)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            package = package[:len(package) - (node.level - 1)]
            base = ".".join(package + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        return [f"{base}.{alias.name}" for alias in node.names] + [base]
    if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else (
            func.attr if isinstance(func, ast.Attribute) else "")
        if name in ("__import__", "import_module"):
            return [node.args[0].value]
    return []


def _resolve(name: str, modules: Mapping[str, pathlib.Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _ancestors(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def build_graph(root: pathlib.Path = REPO, packages: Iterable[str] = ROOTS) -> list[Edge]:
    modules = find_modules(root, packages)
    edges: dict[tuple[str, str, bool], Edge] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        type_only = _type_checking_nodes(tree)
        is_package = path.name == "__init__.py"
        own = set(_ancestors(module)) | {module}
        for node in ast.walk(tree):
            names = _imported_names(node, module, is_package)
            if not names:
                continue
            # `from X import y`: y when it is a module, else X itself
            if isinstance(node, ast.ImportFrom):
                base = names[-1]
                targets = {_resolve(n, modules) for n in names[:-1]}
                targets = {t for t in targets if t is not None and t != _resolve(base, modules)
                           and t.startswith(base + ".")} or {_resolve(base, modules)}
            else:
                targets = {_resolve(n, modules) for n in names}
            for target in targets - {None}:
                # the packages on the way run too, unless we are inside them already
                for reached in [*_ancestors(target), target]:
                    if reached == module or reached not in modules:
                        continue
                    if reached != target and reached in own:
                        continue
                    where = f"{path.relative_to(root)}:{node.lineno}"
                    flag = id(node) in type_only
                    key = (module, reached, flag)
                    if key not in edges:
                        edges[key] = Edge(module, reached, where, flag)
    return list(edges.values())


# --------------------------------------------------------------------------
# circles
# --------------------------------------------------------------------------


def find_cycles(edges: Iterable[Edge]) -> list[list[Edge]]:
    """One circle per strongly connected group of modules (Tarjan), as the
    edges that close it."""
    graph: dict[str, dict[str, Edge]] = {}
    for edge in sorted(edges, key=lambda e: e.type_only):  # an edge that runs names it first
        graph.setdefault(edge.source, {}).setdefault(edge.target, edge)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(start: str) -> None:  # iterative Tarjan: no recursion limit
        work = [(start, iter(sorted(graph.get(start, {}))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, {})))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1 or node in graph.get(node, {}):
                    groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_one_cycle(group, graph) for group in groups]


def _one_cycle(group: list[str], graph: Mapping[str, Mapping[str, Edge]]) -> list[Edge]:
    """A shortest circle through the group's first module (breadth first)."""
    members, start = set(group), group[0]
    came: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt, edge in sorted(graph.get(node, {}).items()):
                if nxt not in members:
                    continue
                if nxt == start:
                    path = [edge]
                    while path[0].source != start:
                        path.insert(0, came[path[0].source])
                    return path
                if nxt not in came:
                    came[nxt] = edge
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no circle found in {group}")


def describe_cycle(cycle: list[Edge]) -> str:
    return " -> ".join([cycle[0].source] + [e.target for e in cycle]) + " (" + ", ".join(
        f"{e.source} -> {e.target} at {e.where}" + (" (type-only)" if e.type_only else "")
        for e in cycle) + ")"


# --------------------------------------------------------------------------
# layers
# --------------------------------------------------------------------------


def part_of(module: str) -> str | None:
    """The part a module belongs to (the longest prefix in PARTS); None when
    none claims it. `linkpassd` claims only the package's own __init__, so a
    new top-level module must be placed on purpose."""
    prefix = _resolve(module, {p: pathlib.Path() for p in PARTS})
    if prefix is None or (prefix == "linkpassd" and module != "linkpassd"):
        return None
    return PARTS[prefix]


def layer_violations(edges: Iterable[Edge]) -> list[str]:
    out = []
    for edge in sorted(edges, key=lambda e: (e.source, e.target)):
        source, target = part_of(edge.source), part_of(edge.target)
        if source is None or target is None or source == target:
            continue
        if target not in ALLOWED[source]:
            kind = "sideways" if source in PROGRAMS and target in PROGRAMS else "upward"
            out.append(f"{edge.source} -> {edge.target} at {edge.where}: {kind}, {source} may "
                       f"not import {target}" + (" (type-only)" if edge.type_only else ""))
    return out


# --------------------------------------------------------------------------
# the tests
# --------------------------------------------------------------------------


@functools.cache
def repo_graph() -> tuple[Edge, ...]:
    return tuple(build_graph())


def test_the_graph_covers_the_code() -> None:
    edges = repo_graph()
    modules = find_modules(REPO)
    assert len(modules) > 150 and len(edges) > 400
    unplaced = sorted(m for m in modules if part_of(m) is None)
    assert unplaced == [], f"modules in no part (add them to PARTS and docs/layers.md): {unplaced}"


def test_no_import_circles() -> None:
    cycles = [describe_cycle(c) for c in find_cycles(repo_graph())]
    assert cycles == [], "import circles:\n" + "\n".join(cycles)


def test_imports_follow_the_layers() -> None:
    violations = layer_violations(repo_graph())
    assert violations == [], "imports against the layers:\n" + "\n".join(violations)


def test_the_allowed_directions_have_no_circle_themselves() -> None:
    """A part may import only parts that may not import it back, directly or
    through others: the parts form layers."""
    allowed = {part: {t for t in targets if t != part} for part, targets in ALLOWED.items()}
    order: list[str] = []
    while allowed:
        ready = sorted(p for p, targets in allowed.items() if targets <= set(order))
        assert ready, f"the allowed directions go round: {allowed}"
        order += ready
        for part in ready:
            del allowed[part]
    assert set(PARTS.values()) == set(ALLOWED)
    for program in PROGRAMS:
        others = set(PROGRAMS) - {program}
        assert program == "labs" or not ALLOWED[program] & others, program


def write(root: pathlib.Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checker_finds_a_circle_hidden_in_a_function(tmp_path: pathlib.Path) -> None:
    write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.b import thing\n",
        "pkg/b.py": "def thing():\n    from pkg import c\n",
        "pkg/c.py": "import pkg.a\n",
        "pkg/e.py": "",
    })
    (cycle,) = find_cycles(build_graph(tmp_path, ["pkg"]))
    text = describe_cycle(cycle)
    assert text.startswith("pkg.a -> pkg.b -> pkg.c -> pkg.a"), text
    assert "pkg/b.py:2" in text  # the import inside the function, by its line


def test_the_checker_finds_a_circle_through_annotations(tmp_path: pathlib.Path) -> None:
    write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/owner.py": "from pkg.part import Part\n",
        "pkg/part.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                       "    from pkg.owner import Owner\n",
    })
    (cycle,) = find_cycles(build_graph(tmp_path, ["pkg"]))
    assert "pkg.part -> pkg.owner at pkg/part.py:3 (type-only)" in describe_cycle(cycle)


def test_the_checker_follows_a_foreign_package_init(tmp_path: pathlib.Path) -> None:
    """`from other.plan import x` runs other/__init__.py, which may import
    back: a circle at import time although no module names the importer."""
    write(tmp_path, {
        "p/__init__.py": "",
        "p/other/__init__.py": "from p.other.lab import Lab\n",
        "p/other/plan.py": "",
        "p/other/lab.py": "from p.helper import help\nfrom p.other.plan import x\n",
        "p/helper.py": "from p.other.plan import LabError\n",
    })
    (cycle,) = find_cycles(build_graph(tmp_path, ["p"]))
    assert {e.source for e in cycle} == {"p.helper", "p.other", "p.other.lab"}, describe_cycle(cycle)


def test_a_new_top_level_module_belongs_to_no_part_until_placed() -> None:
    assert part_of("linkpassd") == "shared" and part_of("linkpassd.logs") == "shared"
    assert part_of("linkpassd.newthing") is None
    assert part_of("linkpassd.daemon.loop") == "daemon"  # a package of the daemon's, too


def test_the_checker_names_a_sideways_import() -> None:
    edges = [Edge("linkpassd.validate.report", "linkpassd.ctl.main", "x.py:1", False),
             Edge("linkpassd.agent.link", "linkpassd.aggregator.identity", "y.py:2", True),
             Edge("linkpassd.core.health", "linkpassd.config.build", "z.py:3", False),
             Edge("labs.demo", "linkpassd.daemon", "w.py:4", False)]
    assert layer_violations(edges) == [
        "linkpassd.agent.link -> linkpassd.aggregator.identity at y.py:2: sideways, daemon may "
        "not import aggregator (type-only)",
        "linkpassd.core.health -> linkpassd.config.build at z.py:3: upward, core may not import "
        "config",
        "linkpassd.validate.report -> linkpassd.ctl.main at x.py:1: upward, validate may not "
        "import ctl",
    ]
