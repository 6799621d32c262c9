"""tests/conftest.py makes SIGTERM unwind the pytest run (so lab teardowns
run) in the pytest process only: a process forked from it must still die of
SIGTERM, as pyroute2's netns helpers are stopped that way."""

from __future__ import annotations

import os
import signal
import time

import pytest


def test_the_run_itself_unwinds_on_sigterm():
    with pytest.raises(KeyboardInterrupt, match="signal 15"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs before this returns


def test_a_forked_child_dies_of_sigterm():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: say it is running, then wait to be killed
        try:
            os.close(r)
            os.write(w, b"x")
            time.sleep(30)
        finally:
            os._exit(3)  # reached only if SIGTERM was caught and unwound
    os.close(w)
    try:
        assert os.read(r, 1) == b"x"
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(r)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, status
