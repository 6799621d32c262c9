"""The documentation's links and the repository paths it names point at something.

Every relative Markdown link in README.md, docs/ and the READMEs under labs/ and
proto/ must name a file of this checkout, and a `#fragment` must name one of that
file's headings (GitHub's anchors). Every repository path the prose names in
backquotes (`labs/bench/probe_floor.py`, `tests/labs/test_fleet_lab.py`, ...) must
exist, so a moved or deleted file cannot leave the docs behind. Paths under
labs/bench/results/ are exempt: that directory is written by the benchmarks and is
not kept in git.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"),
               *(p for p in (REPO / "labs").rglob("README.md")), REPO / "proto" / "README.md"])

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
TOP_DIRS = ("linkpassd/", "labs/", "tests/", "docs/", "scripts/", "systemd/", "examples/",
            "proto/", "packaging/")
CODE_PATH = re.compile(r"`((?:%s)[A-Za-z0-9_./-]*)`" % "|".join(re.escape(d) for d in TOP_DIRS))
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to '-'."""
    found: set[str] = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            text = m.group(1).strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return found


def test_the_docs_are_found() -> None:
    names = {p.relative_to(REPO).as_posix() for p in DOCS}
    assert {"README.md", "docs/operating.md", "docs/probing.md"} <= names


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_links_resolve(doc: Path) -> None:
    text = FENCE.sub("", doc.read_text())
    bad = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # https:, mailto: ...
            continue
        file_part, _, fragment = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            bad.append(f"{target}: no heading #{fragment} in {dest.relative_to(REPO)}")
    assert not bad, f"{doc.relative_to(REPO)}: " + "; ".join(bad)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_named_paths_exist(doc: Path) -> None:
    bad = []
    for path in CODE_PATH.findall(doc.read_text()):
        path = path.rstrip(".")
        if path.startswith("labs/bench/results/") or any(c in path for c in "<>{}*"):
            continue
        if not (REPO / path).exists() and not (REPO / (path + ".py")).exists():
            bad.append(path)
    assert not bad, f"{doc.relative_to(REPO)} names paths that do not exist: {sorted(set(bad))}"
