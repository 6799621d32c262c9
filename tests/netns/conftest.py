"""Fixtures for kernel tests: namespaces created per test, deleted in finally."""

from __future__ import annotations

import contextlib
import os

import pytest

from labs.daemonproc import DaemonProcess, rail_config_toml
from labs.echopeer import NETNS_PEER as ECHO_PEER
from labs.netnslib import HostLab, NetnsFactory

FABRIC = "198.18.0.0/16"  # sources the daemon's echo responder answers (netns labs)


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


@pytest.fixture
def echo_daemon(lab, tmp_path):
    """Factory: linkpassd echo-probing ECHO_PEER (the leaf's loopback) from
    both rails, `interval_ms` apart; the responder is the test's to start
    (labs.echopeer). Stopped at teardown."""
    lab.leaf.ip("link", "set", "lo", "up")  # this kernel has no dummy links
    lab.leaf.ip("addr", "add", f"{ECHO_PEER}/32", "dev", "lo")
    cfg = tmp_path / "linkpassd.toml"
    sock = str(tmp_path / "ctl.sock")
    with contextlib.ExitStack() as stack:
        def start(interval_ms: int = 50, clock: str | None = None,
                  fence: bool = False) -> DaemonProcess:
            probes = (f"[probes]\nenabled = true\ninterval_ms = {interval_ms}\n"
                      f'fabric_prefixes = ["{FABRIC}"]\n'
                      + (f'clock = "{clock}"\n' if clock is not None else ""))
            if fence:  # [fence] on, at its strictest (docs/fencing.md): never fires on noise;
                # the one echo peer is the leaf itself, so its echo evidence may fence alone
                probes += ("[fence]\nenabled = true\nfence_after_s = 0.5\n"
                           "require_leaf_grant = false\nmin_echo_peers = 1\n")
            cfg.write_text(rail_config_toml(sock, str(tmp_path), lab.rails, rise=2,
                                            hold_down_s=1.0, extra=probes,
                                            probe_peers=[[ECHO_PEER], [ECHO_PEER]]))
            daemon = stack.enter_context(
                DaemonProcess(lab.host.name, cfg, sock, tmp_path / "linkpassd.log"))
            daemon.wait_ready()
            return daemon
        yield start
