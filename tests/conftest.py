"""Fixtures shared by every test directory: a private PostgreSQL (labs/pgcluster.py).
And SIGTERM handling for the whole run (pytest_configure)."""

from __future__ import annotations

import os
import signal
import uuid

import pytest

from labs.pgcluster import PostgresUnavailable, find_bindir, private_postgres


_RUN_PID = os.getpid()


def _unwind(signum, frame):
    """SIGTERM in the pytest process: unwind as Ctrl-C does. Anywhere else
    (a process forked from it that did not exec, e.g. pyroute2's netns
    helpers): die of the signal, as without this handler."""
    if os.getpid() != _RUN_PID:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise KeyboardInterrupt(f"stopped by signal {signum}")


def _default_sigterm_in_child() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def pytest_configure(config):
    """SIGTERM (a CI runner cancelling the job, `timeout`, a kill by PID)
    unwinds the run as Ctrl-C does, so every lab's teardown still runs: by
    default it ended the interpreter on the spot, and a run stopped during a
    lab left that lab's processes running. Only in the pytest process
    itself: a forked child gets the default back at once (a first version
    let pyroute2's forked helpers unwind the whole run inside themselves)."""
    global _RUN_PID
    _RUN_PID = os.getpid()
    signal.signal(signal.SIGTERM, _unwind)
    os.register_at_fork(after_in_child=_default_sigterm_in_child)


@pytest.fixture(scope="session")
def pg_cluster():
    """One private PostgreSQL for the whole run (a Unix socket in a temporary
    directory; never the machine's own cluster), stopped and deleted at the
    end. Skips only when the PostgreSQL binaries are not installed; one that
    is installed but cannot start is an error."""
    try:
        find_bindir()
    except PostgresUnavailable as exc:
        pytest.skip(str(exc))
    with private_postgres() as pg:
        yield pg


@pytest.fixture
def pg_databases(pg_cluster):
    """`new()` -> the DSN of a new empty database; all dropped after the test."""
    made: list[str] = []

    def new() -> str:
        name = f"t_{uuid.uuid4().hex[:20]}"
        dsn = pg_cluster.create_database(name)
        made.append(name)
        return dsn

    yield new
    for name in made:
        pg_cluster.drop_database(name)
