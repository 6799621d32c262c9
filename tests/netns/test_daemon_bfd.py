"""linkpassd with BFD to its leaf (FRR bfdd standing in for the switch): a
silent blackhole, with carrier up all along, moves the rail's traffic within
BFD's detection time, and it comes back after the session is Up again and
the hold-down has passed."""

from __future__ import annotations

import os
import time

import pytest

from labs.daemonproc import DaemonProcess, assessment, rail_config_toml
from labs.frr import BfdPeer, FrrBfd
from labs.netnslib import wait_for_sync

pytestmark = pytest.mark.netns

NH0, NH1 = 1_000_100, 1_000_101
INTERVAL_MS, MULT = 100, 3
BFD = f"[bfd]\ninterval_ms = {INTERVAL_MS}\ndetect_mult = {MULT}\n"








def test_silent_blackhole_moves_traffic_on_bfd_and_it_returns(lab, tmp_path):
    peers = [BfdPeer(peer=r.address, local=r.gateway, ifname=r.peer, transmit_ms=INTERVAL_MS,
                     receive_ms=INTERVAL_MS, detect_mult=MULT) for r in lab.rails]
    cfg = tmp_path / "linkpassd.toml"
    sock = str(tmp_path / "ctl.sock")
    cfg.write_text(rail_config_toml(sock, str(tmp_path), lab.rails, rise=2, hold_down_s=1.0,
                                    extra=BFD, bfd=True))
    table = f"lp_bfdhole{os.getpid()}"
    port0 = lab.rails[0].port
    bfd0 = f"bfd:{lab.rails[0].gateway}"
    with FrrBfd(lab.leaf.name, peers) as frr, \
            DaemonProcess(lab.host.name, cfg, sock, tmp_path / "linkpassd.log") as daemon:
        daemon.wait_ready()
        wait_for_sync(lambda: assessment(daemon.status(), port0, bfd0).get("status") == "up",
                      10.0, "BFD up with FRR")
        assert (frr.bfd_peer(lab.rails[0].address) or {}).get("status") == "up"
        assert lab.host.route_nhid(10100) == NH0
        try:
            lab.leaf.nft(f"""
table inet {table} {{
  chain in {{ type filter hook input priority 0; iifname "{lab.rails[0].peer}" drop; }}
  chain out {{ type filter hook output priority 0; oifname "{lab.rails[0].peer}" drop; }}
}}""")
            cut = time.monotonic()
            wait_for_sync(lambda: lab.host.route_nhid(10100) == NH1, 3.0, "rail0 table on rail1")
            moved = time.monotonic() - cut
            assert lab.host.has_carrier(port0), "carrier must stay up: this is a gray failure"
            st = daemon.status()
            judged = assessment(st, port0, bfd0)
            assert judged["status"] == "down" and "control detection time expired" in judged["detail"]
            port = next(p for p in st["ports"] if p["port"] == port0)
            assert port["verdict"] == "VERDICT_DOWN"
            # detection 300 ms + scheduling + the route write; generous bound
            assert moved < 1.5, moved
        finally:
            lab.leaf.nft(f"delete table inet {table}\n")
        healed = time.monotonic()
        wait_for_sync(lambda: lab.host.route_nhid(10100) == NH0, 10.0, "fail-back to rail0")
        assert time.monotonic() - healed >= 1.0  # not before the hold-down


def test_reload_starts_and_stops_bfd_sessions(lab, tmp_path):
    """BFD sessions follow the config on SIGHUP, like everything else."""
    rail0 = lab.rails[0]
    peers = [BfdPeer(peer=rail0.address, local=rail0.gateway, ifname=rail0.peer,
                     transmit_ms=INTERVAL_MS, receive_ms=INTERVAL_MS, detect_mult=MULT)]
    cfg = tmp_path / "linkpassd.toml"
    sock = str(tmp_path / "ctl.sock")
    plain = rail_config_toml(sock, str(tmp_path), lab.rails, extra=BFD)
    cfg.write_text(plain)
    bfd0 = f"bfd:{rail0.gateway}"
    with FrrBfd(lab.leaf.name, peers) as frr, \
            DaemonProcess(lab.host.name, cfg, sock, tmp_path / "linkpassd.log") as daemon:
        daemon.wait_ready()
        assert assessment(daemon.status(), rail0.port, bfd0) == {}
        cfg.write_text(rail_config_toml(sock, str(tmp_path), lab.rails, extra=BFD, bfd=True))
        daemon.proc.send_signal(1)  # SIGHUP
        wait_for_sync(lambda: assessment(daemon.status(), rail0.port, bfd0).get("status")
                      == "up", 10.0, "BFD up after reload")
        assert (frr.bfd_peer(rail0.address) or {}).get("status") == "up"
        cfg.write_text(plain)
        daemon.proc.send_signal(1)
        wait_for_sync(lambda: assessment(daemon.status(), rail0.port, bfd0) == {}, 5.0,
                      "BFD signal gone after reload")
        # we closed it with AdminDown: FRR must not see a path failure
        wait_for_sync(lambda: (frr.bfd_peer(rail0.address) or {}).get("status") != "up", 5.0,
                      "FRR to see the session end")
        assert daemon.status()["last_error"] == ""
