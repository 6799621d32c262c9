"""Fixtures shared by every test directory: a private PostgreSQL (labs/pgcluster.py);
and SIGTERM taken as an interrupt, so that a run stopped by `timeout` or a CI
runner still tears down its namespaces, labs and processes."""

from __future__ import annotations

import os
import signal
import uuid

import pytest

from labs.pgcluster import PostgresUnavailable, find_bindir, private_postgres


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM raises KeyboardInterrupt in the test run's own process: pytest
    then stops as on Ctrl-C, running every fixture's teardown (by default
    SIGTERM ends the process at once, and a run stopped by `timeout` left its
    namespaces behind). A child forked from it keeps the default."""
    main = os.getpid()

    def on_term(signum: int, frame) -> None:
        if os.getpid() != main:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise KeyboardInterrupt(f"signal {signum} (SIGTERM)")

    signal.signal(signal.SIGTERM, on_term)


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
