"""Packaging conventions: the licence file matches the SPDX expression in
pyproject.toml, and the wheel carries the licence, the systemd units and the
example config (installed copies equal to the repository's canonical ones)."""

from __future__ import annotations

import email.parser
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from linkpassd import data

REPO = Path(__file__).resolve().parents[2]
CANONICAL = {
    "linkpassd.service": REPO / "systemd" / "linkpassd.service",
    "linkpass-aggregator.service": REPO / "systemd" / "linkpass-aggregator.service",
    "linkpassd.toml": REPO / "examples" / "linkpassd.toml",
    "aggregator.toml": REPO / "examples" / "aggregator.toml",
}


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


@pytest.mark.parametrize("name", sorted(CANONICAL))
def test_packaged_copy_equals_the_canonical_file(name: str) -> None:
    packaged = REPO / "linkpassd" / "data" / name
    assert packaged.read_text() == CANONICAL[name].read_text(), (
        f"{packaged.relative_to(REPO)} differs from {CANONICAL[name].relative_to(REPO)}: "
        f"edit the canonical file, then `cp {CANONICAL[name].relative_to(REPO)} "
        f"{packaged.relative_to(REPO)}`")


def test_every_canonical_file_is_packaged_and_loadable() -> None:
    assert set(data.FILES) == set(CANONICAL)
    for name in data.FILES:
        assert data.read_text(name) == CANONICAL[name].read_text()
    with pytest.raises(ValueError, match="'nope.service'"):
        data.read_text("nope.service")


def test_license_file_matches_the_spdx_expression() -> None:
    project = pyproject()["project"]
    assert project["license"] == "Apache-2.0"  # an SPDX expression, not a table
    assert project["license-files"] == ["LICENSE"]
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
    # PEP 639 metadata needs setuptools >= 77
    assert "setuptools>=77" in pyproject()["build-system"]["requires"]


def test_wheel_carries_license_units_and_example(tmp_path: Path) -> None:
    """Build a real wheel from a copy of the sources (the working tree stays
    untouched) with the setuptools this venv has, offline."""
    import setuptools

    major = int(setuptools.__version__.split(".")[0])
    if major < 77:
        pytest.skip(f"setuptools {setuptools.__version__} < 77 in this venv")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "linkpassd", src / "linkpassd",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (src / "scripts").mkdir()
    shutil.copy2(REPO / "scripts" / "linkpass-certs", src / "scripts" / "linkpass-certs")
    out = tmp_path / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = out.glob("linkpass-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(zf.read(f"{dist_info}/METADATA").decode())
        assert metadata["License-Expression"] == "Apache-2.0"
        assert metadata.get_all("License-File") == ["LICENSE"]
        assert zf.read(f"{dist_info}/licenses/LICENSE") == (REPO / "LICENSE").read_bytes()
        for name, canonical in CANONICAL.items():
            assert zf.read(f"linkpassd/data/{name}") == canonical.read_bytes(), name
        # the certificate tool, installed next to the console scripts
        data_dir = dist_info.removesuffix(".dist-info") + ".data"
        certs = zf.getinfo(f"{data_dir}/scripts/linkpass-certs")
        assert zf.read(certs) == (REPO / "scripts" / "linkpass-certs").read_bytes()
        assert (certs.external_attr >> 16) & 0o111, "linkpass-certs is not executable in the wheel"


def test_the_aggregator_example_names_every_option_with_its_default() -> None:
    """examples/aggregator.toml is complete: every section and key of the
    aggregator's schema, each with the value a missing key would get (and TLS
    files, which have no default)."""
    import dataclasses

    from linkpassd.aggregator import settings
    from linkpassd.config.aggregator_schema import AGGREGATOR_SCHEMA

    text = CANONICAL["aggregator.toml"].read_text()
    doc = tomllib.loads(text)
    for section in AGGREGATOR_SCHEMA:
        keys = {option.key for option in section.options}
        if section.name == "tls":
            assert set(doc["tls"]) == {"ca", "cert", "key"}, doc["tls"]
            continue
        assert set(doc.get(section.name, {})) | ({"postgresql_dsn"} if section.name == "aggregator"
                                                 else set()) == keys, section.name
    assert "# postgresql_dsn = " in text and "# insecure = true" in text  # shown, commented out
    parsed = settings.parse_settings(text, "examples/aggregator.toml")
    defaults = settings.Settings(source=parsed.source, tls=parsed.tls)
    changed = [f.name for f in dataclasses.fields(parsed) if getattr(parsed, f.name) != getattr(defaults, f.name)]
    assert not changed, f"the example differs from the defaults in {changed}"


# --------------------------------------------------------------------------
# shell completion: click's script, exercised by a real bash
# --------------------------------------------------------------------------


def completion_script(shell: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "linkpassd.ctl.main", "completion", shell],
                          capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def bash_complete(tmp_path: Path, *words: str) -> list[str]:
    """Source the script in bash and complete `words` (the last one is the
    word being typed) the way bash-completion would on TAB."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    program = bindir / "linkpassctl"  # what an install puts on PATH
    program.write_text(f'#!/bin/sh\nexec {sys.executable} -m linkpassd.ctl.main "$@"\n')
    program.chmod(0o755)
    script = tmp_path / "linkpassctl.bash"
    script.write_text(completion_script("bash"))
    quoted = " ".join(f"'{w}'" for w in ("linkpassctl", *words))
    probe = (f"source {script}\nCOMP_WORDS=({quoted})\nCOMP_CWORD={len(words)}\n"
             "_linkpassctl_completion linkpassctl\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n")
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(["bash", "--norc", "--noprofile", "-c", probe], capture_output=True,
                          text=True, timeout=60, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return [line for line in proc.stdout.splitlines() if line]


def test_bash_completes_commands_options_and_shells(tmp_path: Path) -> None:
    from linkpassd.ctl.main import cli

    assert bash_complete(tmp_path, "sta") == ["status"]
    if "drain" in cli.commands:  # helper C's command, once it is there
        assert "drain" in bash_complete(tmp_path, "dr")
    assert "--output" in bash_complete(tmp_path, "status", "--ou")
    assert bash_complete(tmp_path, "completion", "") == ["bash", "zsh", "fish"]


def test_zsh_and_fish_scripts_name_the_program() -> None:
    assert "compdef _linkpassctl_completion linkpassctl" in completion_script("zsh")
    assert "complete --no-files --command linkpassctl" in completion_script("fish")
