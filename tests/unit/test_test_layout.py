"""`make test` collects every test directory in one pytest run, which imports
test modules by their bare names (pyproject.toml): two test files with one
basename stop the whole run at collection. Caught here, in the unit tests a
developer runs first, rather than at the end of a helper's branch in CI."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_basename_is_unique_across_test_directories():
    where: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        where[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: sorted(paths) for name, paths in where.items() if len(paths) > 1}
    assert clashes == {}, f"rename one of each: {clashes}"
