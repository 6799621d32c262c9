"""Fixtures shared by every test directory: a private PostgreSQL (labs/pgcluster.py).
And SIGTERM handling for the whole run (pytest_configure)."""

from __future__ import annotations

import signal
import threading
import uuid

import pytest

from labs.pgcluster import PostgresUnavailable, find_bindir, private_postgres


def _unwind(signum, frame):
    raise KeyboardInterrupt(f"stopped by signal {signum}")


def pytest_configure(config):
    """SIGTERM (a CI runner cancelling the job, `timeout`, a kill by PID)
    unwinds the run as Ctrl-C does, so every lab's teardown still runs. By
    default it ended the interpreter on the spot: a CI run stopped during a
    lab left that lab's lldpd processes running."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _unwind)


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
