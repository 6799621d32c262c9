"""A test run stopped from outside leaves no namespace behind: SIGTERM (what
`timeout` and CI runners send) runs every fixture's teardown
(tests/conftest.py), and namespaces a killed run left are deleted by the
next run (labs.netnslib.reap_stale_namespaces)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labs.netnslib import NetnsFactory, reap_stale_namespaces, run_ip

HERE = Path(__file__)
HOLDER = "LINKPASS_TEST_HOLD_NAMESPACE"  # set only by the test below, for its child run


def namespaces() -> set[str]:
    return {line.split()[0] for line in run_ip("netns", "list").stdout.splitlines() if line.strip()}


@pytest.mark.skipif(HOLDER not in os.environ, reason="the child run of the SIGTERM test only")
def test_holds_a_namespace_until_stopped(netns_factory):
    ns = netns_factory("h")
    Path(os.environ[HOLDER]).write_text(ns.name)
    time.sleep(60)


def test_a_run_stopped_by_sigterm_deletes_its_namespaces(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces")
    said = tmp_path / "name"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"{HERE}::test_holds_a_namespace_until_stopped"],
        env={**os.environ, HOLDER: str(said)}, cwd=HERE.parents[2],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (said.exists() and said.read_text()):
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the child run never made its namespace"
            time.sleep(0.1)
        name = said.read_text()
        assert name in namespaces()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 2, out  # pytest's "interrupted"
    assert name not in namespaces(), out


def test_a_killed_runs_namespaces_are_deleted_by_the_next(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces")
    gone = subprocess.Popen(["true"])
    gone.wait(10)
    stale = f"lp-h{gone.pid}-0"  # as unique_name() names them in a process now gone
    mine = NetnsFactory()
    live = mine("h")  # this process's: alive, never reaped
    try:
        run_ip("netns", "add", stale)
        assert stale in reap_stale_namespaces()  # with any other a killed run left
        assert stale not in namespaces() and live.name in namespaces()
    finally:
        run_ip("netns", "delete", stale, check=False)
        assert mine.cleanup() == []
