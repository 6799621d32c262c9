"""What the validation labs share (test_validate_lab, test_direction_lab):
the skip when this machine cannot run the lab, and the wait for a healthy
fabric that fails the test naming what is not."""

from __future__ import annotations

import os
import shutil

import pytest

from labs import validation
from labs.topos.plan import LabError


def needs_lab() -> None:
    if os.geteuid() != 0 or shutil.which("mnexec") is None or shutil.which("lldpd") is None:
        pytest.skip("needs root, mnexec and lldpd (./scripts/bootstrap.sh installs them)")


def wait_healthy(lab) -> None:
    try:
        validation.wait_healthy(lab)
    except LabError as exc:
        pytest.fail(str(exc))
