"""The core decides; it must not reach the kernel, sockets or clocks."""

import ast
import pathlib

import linkpassd.core

FORBIDDEN = {"asyncio", "pyroute2", "grpc", "socket", "os", "time", "subprocess",
             "threading", "random", "datetime", "select", "signal"}
CORE = pathlib.Path(linkpassd.core.__file__).parent


def imported_modules(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            names.add("linkpassd.core." + (node.module or ""))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "__import__":
            names.add("<dynamic import>")
    return names


def test_core_has_modules_to_check():
    assert len(list(CORE.glob("*.py"))) >= 4


def test_core_imports_nothing_that_touches_the_outside():
    offenders = {}
    for path in CORE.rglob("*.py"):
        for name in imported_modules(path):
            top = name.split(".")[0]
            if top in FORBIDDEN or name == "<dynamic import>":
                offenders.setdefault(path.name, []).append(name)
            if top == "linkpassd" and not name.startswith("linkpassd.core"):
                offenders.setdefault(path.name, []).append(name)
    assert offenders == {}


def test_the_checker_itself_catches_a_forbidden_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom time import monotonic\nfrom pyroute2 import IPRoute\n")
    assert {"os", "time", "pyroute2"} <= imported_modules(bad)
