"""Fencing ([fence], docs/fencing.md) end to end against the real kernel: a
host namespace with two rails to a leaf namespace, linkpassd echo-probing the
leaf's loopback from both rails, and a silent blackhole (nftables drops on
the leaf's side of rail 0, carrier up) that only the probes can see.

With fencing on, rail 0's port goes administratively down once the failure
has lasted fence_after_s (the leaf's end of the veth loses carrier), rail 1
keeps carrying its traffic and rail 0's, the port is brought up for a test
after each backoff and taken down again while the fault stays, and once the
fault clears it is back at the next test, within the backoff, and the routes
return. Short hiccups never fence.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from labs.daemonproc import DaemonProcess, assessment, rail_config_toml
from labs.echopeer import NETNS_PEER as ECHO_PEER
from labs.echopeer import EchoPeerProcess
from labs.netnslib import wait_for_sync

pytestmark = pytest.mark.netns

FABRIC = "198.18.0.0/16"
NH0, NH1 = 1_000_100, 1_000_101
RAIL0_TABLE, RAIL1_TABLE = 10100, 10101
FENCE_AFTER_S, BACKOFF_S, TEST_WINDOW_S, TEST_TIMEOUT_S = 1.0, 4.0, 1.0, 3.0


@pytest.fixture
def fence_daemon(lab, tmp_path):
    lab.leaf.ip("link", "set", "lo", "up")
    lab.leaf.ip("addr", "add", f"{ECHO_PEER}/32", "dev", "lo")
    cfg = tmp_path / "linkpassd.toml"
    sock = str(tmp_path / "ctl.sock")
    extra = (f"[probes]\nenabled = true\ninterval_ms = 50\nfabric_prefixes = [\"{FABRIC}\"]\n"
             f"[fence]\nenabled = true\nfence_after_s = {FENCE_AFTER_S}\n"
             f"backoff_initial_s = {BACKOFF_S}\nbackoff_max_s = 16.0\n"
             f"test_window_s = {TEST_WINDOW_S}\ntest_timeout_s = {TEST_TIMEOUT_S}\n"
             "require_leaf_grant = false\n"
             "min_echo_peers = 1\n")  # the rail's one echo peer is the leaf itself
    cfg.write_text(rail_config_toml(sock, str(tmp_path), lab.rails, rise=2, hold_down_s=1.0,
                                    extra=extra, probe_peers=[[ECHO_PEER], [ECHO_PEER]]))
    with contextlib.ExitStack() as stack:
        def start() -> DaemonProcess:
            daemon = stack.enter_context(
                DaemonProcess(lab.host.name, cfg, sock, tmp_path / "linkpassd.log"))
            daemon.wait_ready()
            return daemon
        yield start


def admin_up(lab, port: str) -> bool:
    (link,) = lab.host.ipj("link", "show", "dev", port)
    return "UP" in link["flags"]


def fence_events(daemon: DaemonProcess) -> list[dict]:
    out = []
    for line in daemon.log().splitlines():
        if "fence_" not in line:
            continue
        with contextlib.suppress(ValueError):
            doc = json.loads(line)
            if str(doc.get("event", "")).startswith("fence_") and doc.get("event") != "fence_write":
                out.append(doc)
                continue
        if "event=fence_" in line or " fence_" in line:
            out.append({"line": line})
    return out


def blackhole(lab, table: str) -> None:
    peer = lab.rails[0].peer
    lab.leaf.nft(f"table inet {table} {{\n"
                 f'  chain in {{ type filter hook input priority 0; iifname "{peer}" drop; }}\n'
                 f'  chain out {{ type filter hook output priority 0; oifname "{peer}" drop; }}\n'
                 "}\n")


def test_a_blackholed_rail_is_fenced_tested_and_back_once_the_fault_clears(lab, fence_daemon):
    rail0, rail1 = lab.rails
    table = f"lp_fence{os.getpid()}"
    with EchoPeerProcess(lab.leaf.name, duration=90):
        daemon = fence_daemon()
        wait_for_sync(lambda: assessment(daemon.status(), rail0.port, "echo").get("status") == "ok",
                      5.0, "echo up on rail0")
        assert lab.host.route_nhid(RAIL0_TABLE) == NH0 and lab.host.route_nhid(RAIL1_TABLE) == NH1
        blackhole(lab, table)
        try:
            cut = time.monotonic()
            wait_for_sync(lambda: lab.host.route_nhid(RAIL0_TABLE) == NH1, 3.0, "rail0 on rail1")
            assert admin_up(lab, rail0.port), "not fenced at detection: fence_after_s is a stricter bar"
            wait_for_sync(lambda: not admin_up(lab, rail0.port), FENCE_AFTER_S + 3.0, "rail0 fenced")
            fenced = time.monotonic() - cut
            assert fenced >= FENCE_AFTER_S, fenced
            # The leaf sees carrier loss; rail 1 carries its own traffic and rail 0's.
            assert not lab.leaf.has_carrier(rail0.peer)
            assert admin_up(lab, rail1.port) and lab.host.has_carrier(rail1.port)
            assert lab.host.route_nhid(RAIL1_TABLE) == NH1
            assert lab.host.route_nhid(RAIL0_TABLE) == NH1
            # After the backoff: up for a test, the routes stay away, the test fails, down again.
            went_down = time.monotonic()
            wait_for_sync(lambda: admin_up(lab, rail0.port), BACKOFF_S + 2.0, "rail0 up for a test")
            assert time.monotonic() - went_down >= BACKOFF_S - 0.5
            testing_since = time.monotonic()
            while time.monotonic() - testing_since < 1.0:
                assert lab.host.route_nhid(RAIL0_TABLE) == NH1, "traffic went back to a port under test"
                time.sleep(0.05)
            wait_for_sync(lambda: not admin_up(lab, rail0.port), TEST_TIMEOUT_S + 2.0,
                          "rail0 fenced again after its failed test")
        finally:
            lab.leaf.nft(f"delete table inet {table}\n")
        cleared = time.monotonic()
        # The backoff doubled (8 s): the port is up for its next test within it,
        # proves itself in test_window_s and the fence ends; then the routes return.
        wait_for_sync(lambda: admin_up(lab, rail0.port), 2 * BACKOFF_S + 1.0, "rail0 up again")
        wait_for_sync(lambda: lab.host.route_nhid(RAIL0_TABLE) == NH0, TEST_WINDOW_S + 5.0,
                      "rail0 back on its own path")
        assert time.monotonic() - cleared <= 2 * BACKOFF_S + TEST_WINDOW_S + 5.0
        time.sleep(TEST_TIMEOUT_S + 0.5)  # no second failed test after the fault cleared
        assert admin_up(lab, rail0.port) and lab.host.route_nhid(RAIL0_TABLE) == NH0
        names = [e.get("event", e.get("line", "")) for e in fence_events(daemon)]
        text = "\n".join(map(str, names))
        for name in ("fence_fence", "fence_test", "fence_refence", "fence_unfence"):
            assert name in text, (name, text)
        assert daemon.status()["last_error"] == ""


def test_hiccups_shorter_than_fence_after_never_fence(lab, fence_daemon):
    rail0 = lab.rails[0]
    table = f"lp_fencehic{os.getpid()}"
    with EchoPeerProcess(lab.leaf.name, duration=60):
        daemon = fence_daemon()
        wait_for_sync(lambda: assessment(daemon.status(), rail0.port, "echo").get("status") == "ok",
                      5.0, "echo up on rail0")
        for _ in range(5):
            blackhole(lab, table)
            try:
                end = time.monotonic() + FENCE_AFTER_S / 2
                while time.monotonic() < end:
                    assert admin_up(lab, rail0.port)
                    time.sleep(0.02)
            finally:
                lab.leaf.nft(f"delete table inet {table}\n")
            wait_for_sync(lambda: lab.host.route_nhid(RAIL0_TABLE) == NH0, 10.0, "rail0 back")
        assert admin_up(lab, rail0.port)
        assert not [e for e in fence_events(daemon)
                    if "fence_fence" in json.dumps(e)], fence_events(daemon)


def ctl(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "linkpassd.ctl.main", "--socket", daemon.socket_path,
                           "--timeout", "10", *args], capture_output=True, text=True, timeout=30)


def fence_state(daemon: DaemonProcess, port: str) -> str:
    out = ctl(daemon, "fences", "-o", "json")
    assert out.returncode == 0, out.stderr
    return next(f["state"] for f in json.loads(out.stdout)["fences"] if f["port"] == port)


def test_a_fence_outlives_no_daemon_and_an_operator_lifts_it(lab, fence_daemon, tmp_path):
    """SIGKILL while fenced: the port stays down (nobody may touch it), and the
    next start brings it up and tests it; with the fault gone it is back. A
    clean stop brings a fenced port up. `linkpassctl fences` shows the state,
    `linkpassctl unfence` lifts it while the fault is still there."""
    rail0 = lab.rails[0]
    table = f"lp_fencerst{os.getpid()}"
    with EchoPeerProcess(lab.leaf.name, duration=120):
        daemon = fence_daemon()
        wait_for_sync(lambda: assessment(daemon.status(), rail0.port, "echo").get("status") == "ok",
                      5.0, "echo up on rail0")
        blackhole(lab, table)
        try:
            wait_for_sync(lambda: not admin_up(lab, rail0.port), FENCE_AFTER_S + 3.0, "rail0 fenced")
            assert fence_state(daemon, rail0.port) == "FENCED"
            owned = json.loads((tmp_path / "state" / "fences.json").read_text())
            assert rail0.port in owned["down"]
            daemon.stop(signal.SIGKILL)
            time.sleep(0.5)
            assert not admin_up(lab, rail0.port)  # no daemon, no change
        finally:
            lab.leaf.nft(f"delete table inet {table}\n")
        restarted = fence_daemon()
        started = time.monotonic()
        wait_for_sync(lambda: admin_up(lab, rail0.port), 3.0, "rail0 up for a test at start")
        wait_for_sync(lambda: lab.host.route_nhid(RAIL0_TABLE) == NH0, TEST_WINDOW_S + 6.0,
                      "rail0 trusted again on its own probes")
        assert time.monotonic() - started < BACKOFF_S + TEST_WINDOW_S + 6.0
        assert fence_state(restarted, rail0.port) == "ARMED"
        assert "fence_unfence" in restarted.log()

        # fenced again, then lifted by the operator while the fault stays
        blackhole(lab, table)
        try:
            wait_for_sync(lambda: not admin_up(lab, rail0.port), FENCE_AFTER_S + 3.0, "rail0 fenced")
            lifted = ctl(restarted, "unfence", rail0.port, "--for", "1h")
            assert lifted.returncode == 0, lifted.stderr
            wait_for_sync(lambda: admin_up(lab, rail0.port), 2.0, "rail0 up after the lift")
            assert fence_state(restarted, rail0.port) == "LIFTED"
            time.sleep(BACKOFF_S + FENCE_AFTER_S)  # still dead, lifted: not fenced again
            assert admin_up(lab, rail0.port)
            assert lab.host.route_nhid(RAIL0_TABLE) == NH1  # the routes still follow its health
            assert "fence_release" in restarted.log()
        finally:
            lab.leaf.nft(f"delete table inet {table}\n")
        bad = ctl(restarted, "unfence", "nosuchport")
        assert bad.returncode == 5 and "nosuchport" in bad.stderr


def test_a_clean_stop_brings_a_fenced_port_up(lab, fence_daemon):
    rail0 = lab.rails[0]
    table = f"lp_fencestop{os.getpid()}"
    with EchoPeerProcess(lab.leaf.name, duration=60):
        daemon = fence_daemon()
        wait_for_sync(lambda: assessment(daemon.status(), rail0.port, "echo").get("status") == "ok",
                      5.0, "echo up on rail0")
        blackhole(lab, table)
        try:
            wait_for_sync(lambda: not admin_up(lab, rail0.port), FENCE_AFTER_S + 3.0, "rail0 fenced")
            assert daemon.stop() == 0
            assert admin_up(lab, rail0.port)
        finally:
            lab.leaf.nft(f"delete table inet {table}\n")


def test_never_the_last_healthy_rail(lab, fence_daemon):
    """Both rails blackholed: both DOWN, neither fenced; the hold is said."""
    table0 = f"lp_fencel{os.getpid()}"
    with EchoPeerProcess(lab.leaf.name, duration=60):
        daemon = fence_daemon()
        for rail in lab.rails:
            wait_for_sync(lambda r=rail: assessment(daemon.status(), r.port, "echo").get("status") == "ok",
                          5.0, "echo up")
        peers = " ".join(f'"{r.peer}",' for r in lab.rails).rstrip(",")
        lab.leaf.nft(f"table inet {table0} {{\n"
                     f"  chain in {{ type filter hook input priority 0; iifname {{ {peers} }} drop; }}\n"
                     f"  chain out {{ type filter hook output priority 0; oifname {{ {peers} }} drop; }}\n"
                     "}\n")
        try:
            wait_for_sync(lambda: all(assessment(daemon.status(), r.port, "echo").get("status") == "down"
                                      for r in lab.rails), 3.0, "both rails down")
            end = time.monotonic() + FENCE_AFTER_S + 2.0
            while time.monotonic() < end:
                assert all(admin_up(lab, r.port) for r in lab.rails)
                time.sleep(0.05)
            assert "no other rail is healthy" in daemon.log()
            assert all(fence_state(daemon, r.port) == "CONFIRMING" for r in lab.rails)
        finally:
            lab.leaf.nft(f"delete table inet {table0}\n")
