"""The Debian package's recipe (scripts/build-deb.sh, packaging/deb/) agrees
with what it packages: every program the wheel installs is linked into
/usr/bin, every unit's ExecStart= names one of those links, both example
configs are conffiles, the maintainer scripts parse, and linkpassctl's man
page gets every command. (`make deb` itself builds and the report of issue 28
shows dpkg -i / -r; building here would need the network.)"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "scripts" / "build-deb.sh"
DEB = REPO / "packaging" / "deb"


def build_array(name: str) -> list[str]:
    match = re.search(rf"^{name}=\(([^)]*)\)", BUILD.read_text(), re.M)
    assert match, f"{BUILD.name} has no {name}=(...)"
    return shlex.split(match.group(1))


def test_every_installed_program_is_linked_into_usr_bin() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    programs = set(project["project"]["scripts"])
    programs |= {Path(p).name for p in project["tool"]["setuptools"]["script-files"]}
    assert set(build_array("SCRIPTS")) == programs
    assert 'ln -s "$PREFIX/bin/$name" "$ROOT/usr/bin/$name"' in BUILD.read_text()


@pytest.mark.parametrize("unit", ["linkpassd.service", "linkpass-aggregator.service"])
def test_units_run_what_the_package_installs(unit: str) -> None:
    text = (REPO / "systemd" / unit).read_text()
    for key in ("ExecStart", "ExecStartPre"):
        programs = {line.split("=", 1)[1].split()[0] for line in text.splitlines()
                    if line.startswith(f"{key}=")}
        if key == "ExecStartPre" and not programs:
            continue  # linkpassd has none (tests/unit/test_systemd_units.py)
        (program,) = programs
        assert program.startswith("/usr/bin/") and program[len("/usr/bin/"):] in build_array("SCRIPTS")
    assert f"systemd/{unit}" in BUILD.read_text()


def test_example_configs_are_conffiles() -> None:
    text = BUILD.read_text()
    examples = sorted(p.name for p in (REPO / "examples").glob("*.toml"))
    assert examples == ["aggregator.toml", "linkpassd.toml"]
    for name in examples:
        assert f"examples/{name}" in text and f"/etc/linkpass/{name}" in text


@pytest.mark.parametrize("script", ["postinst", "prerm", "postrm"])
def test_maintainer_scripts_parse_and_are_executable(script: str) -> None:
    path = DEB / script
    assert path.stat().st_mode & 0o111
    proc = subprocess.run(["sh", "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert path.read_text().startswith("#!/bin/sh\n") and "set -e" in path.read_text()


def test_the_man_page_gets_every_linkpassctl_command() -> None:
    from linkpassd.ctl.main import cli

    proc = subprocess.run([sys.executable, str(DEB / "man_commands.py"), "linkpassd.ctl.main:cli",
                           "linkpassctl"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "[COMMANDS]"
    assert {line[4:] for line in lines if line.startswith(".SS ")} >= set(cli.commands)
    assert "Usage: linkpassctl drain [OPTIONS] PORT" in proc.stdout
    # nothing roff would read as a request inside the literal help text
    body = [line for line in lines[1:] if not line.startswith((".SS ", ".nf", ".fi"))]
    assert not [line for line in body if line.startswith((".", "'"))]
