"""The daemon package stays a loop with collaborators (docs/architecture.md):
no module reaches into another's private names, only the loop and the
command line know the loop, and nothing else in linkpassd imports the daemon."""

from __future__ import annotations

import ast
import pathlib

import linkpassd

ROOT = pathlib.Path(linkpassd.__file__).parent
PACKAGE = ROOT / "daemon"


def imports(path: pathlib.Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_no_module_of_the_daemon_uses_another_objects_private_names():
    offenders = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                offenders.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert offenders == []


def test_only_the_command_line_imports_the_loop():
    users = {path.name for path in PACKAGE.glob("*.py")
             if "linkpassd.daemon.loop" in imports(path)}
    assert users == {"cli.py"}


def test_nothing_outside_the_daemon_imports_it():
    offenders = [str(path.relative_to(ROOT)) for path in ROOT.rglob("*.py")
                 if PACKAGE not in path.parents
                 and any(m == "linkpassd.daemon" or m.startswith("linkpassd.daemon.")
                         for m in imports(path))]
    assert offenders == []
