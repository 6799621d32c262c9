"""Fixtures for kernel tests: namespaces created per test, deleted in finally."""

from __future__ import annotations

import os

import pytest

from labs.netnslib import HostLab, NetnsFactory


@pytest.fixture
def netns_factory():
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces")
    factory = NetnsFactory()
    try:
        yield factory
    finally:
        errors = factory.cleanup()
        assert not errors, f"namespace teardown failed: {errors}"


@pytest.fixture
def lab(netns_factory) -> HostLab:
    """A host namespace with two rails to a leaf namespace (see HostLab)."""
    return HostLab.build(netns_factory, n_rails=2)
