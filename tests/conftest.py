"""Fixtures shared by every test directory: a private PostgreSQL (labs/pgcluster.py)."""

from __future__ import annotations

import uuid

import pytest

from labs.pgcluster import PostgresUnavailable, find_bindir, private_postgres


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
