"""Fixtures of the control-socket tests (test_control_api, test_control_explain,
test_control_ops). Fixtures named here, not imported from one test module into
another: an imported fixture is an unused name to a linter and a parameter of
that name redefines it. `local_zone` is not autouse here; the modules that need
it say so with `pytestmark`."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def local_zone(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """linkpassctl shows times in the local zone with its offset; tests pin
    the zone to UTC+1 (a POSIX TZ needs no tzdata) so the offset shows."""
    monkeypatch.setenv("TZ", "CET-1")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def sock() -> Iterator[Path]:
    """A socket path in a fresh 0755 directory under /tmp: short (AF_UNIX
    names, the proxy's caller names included, fit in 108 bytes), and
    traversable by uid 65534, which pytest's 0700 tmp_path is not."""
    base = Path(tempfile.mkdtemp(prefix="lp-ctl-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        yield base / "run" / "linkpassd.sock"
    finally:
        shutil.rmtree(base, ignore_errors=True)
