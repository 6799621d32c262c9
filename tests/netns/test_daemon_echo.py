"""linkpassd probing a peer with UDP echo, end to end, against the real kernel.

The leaf namespace stands in for the fabric and the peer host at once: it holds
the peer address 198.19.9.1 on its loopback and runs an echo responder
(labs.echopeer). Both rails probe it, each through its own gateway. Faults are
nftables drops on the leaf side of rail 0 with carrier up all along: only the
probes can see them.
"""

from __future__ import annotations

import os
import time

import pytest

from labs.daemonproc import assessment
from labs.echopeer import NETNS_PEER as PEER
from labs.echopeer import EchoPeerProcess
from labs.netnslib import wait_for_sync

pytestmark = pytest.mark.netns

NH0, NH1 = 1_000_100, 1_000_101
RAIL0_TABLE, PROBE0_TABLE = 10100, 10103  # rails 10100-1, the group 10102, then probe tables


def test_a_peer_that_never_answered_fails_nothing(lab, echo_daemon):
    """No responder yet: the paths are 'never up', not down, and nothing moves."""
    probed = echo_daemon()
    port0 = lab.rails[0].port
    wait_for_sync(lambda: assessment(probed.status(), port0, "echo").get("status") == "never up", 5.0,
                  "echo reported as never up")
    time.sleep(1.0)  # 20 probe intervals without an answer
    assert lab.host.route_nhid(RAIL0_TABLE) == NH0
    assert assessment(probed.status(), port0, "echo")["status"] == "never up"
    with EchoPeerProcess(lab.leaf.name, duration=30):
        wait_for_sync(lambda: assessment(probed.status(), port0, "echo").get("status") == "ok", 5.0,
                      "echo up once the peer answers")


@pytest.mark.parametrize("fault", ["blackhole", "replies-lost"])
def test_gray_failure_moves_traffic_on_echo_and_it_returns(lab, echo_daemon, fault):
    rail0 = lab.rails[0]
    table = f"lp_echohole{os.getpid()}"
    drops = {
        "blackhole": (f'chain in {{ type filter hook input priority 0; iifname "{rail0.peer}" '
                      f'drop; }}\n  chain out {{ type filter hook output priority 0; oifname '
                      f'"{rail0.peer}" drop; }}'),
        # the peer hears us, we never hear it: one-way loss
        "replies-lost": (f'chain out {{ type filter hook output priority 0; oifname '
                         f'"{rail0.peer}" udp sport 4793 drop; }}'),
    }[fault]
    # The peer answers from the start: an ICMP port unreachable (peer daemon not
    # up yet) would make misses unjudged for a grace period.
    with EchoPeerProcess(lab.leaf.name, duration=60) as peer:
        probed = echo_daemon()
        wait_for_sync(lambda: assessment(probed.status(), rail0.port, "echo").get("status") == "ok",
                      5.0, "echo up on rail0")
        assert lab.host.route_nhid(RAIL0_TABLE) == NH0 and lab.host.route_nhid(PROBE0_TABLE) == NH0
        try:
            lab.leaf.nft(f"table inet {table} {{\n  {drops}\n}}\n")
            cut = time.monotonic()
            wait_for_sync(lambda: lab.host.route_nhid(RAIL0_TABLE) == NH1, 3.0, "rail0 table on rail1")
            moved = time.monotonic() - cut
            assert lab.host.has_carrier(rail0.port), "carrier must stay up: a gray failure"
            judged = assessment(probed.status(), rail0.port, "echo")
            assert judged["status"] == "down" and PEER in judged["detail"], judged
            # Probes keep their own path, so recovery can be seen.
            assert lab.host.route_nhid(PROBE0_TABLE) == NH0
            # The steady interval plus the burst is ~75 ms; nft's own start-up and the
            # polling here add more. Generous, but well under BFD's 3 x 50 ms + slack.
            assert moved < 1.0, moved
        finally:
            lab.leaf.nft(f"delete table inet {table}\n")
        healed = time.monotonic()
        wait_for_sync(lambda: lab.host.route_nhid(RAIL0_TABLE) == NH0, 10.0, "fail-back to rail0")
        assert time.monotonic() - healed >= 1.0  # not before the hold-down
        assert assessment(probed.status(), rail0.port, "echo")["status"] == "ok"
        assert probed.status()["last_error"] == ""
    assert peer.proc.returncode is not None


def test_sustained_random_loss_is_degraded_and_drained_then_given_back(lab, echo_daemon):
    """25 % loss each way on rail 0 (an exchange fails 44 % of the time): the
    path is DEGRADED once a window of probes says so, and rail 0's traffic is
    drained to the healthy rail 1; once the loss stops it comes back after
    the loss clears from the window and the hold-down."""
    rail0 = lab.rails[0]
    table = f"lp_echoloss{os.getpid()}"
    with EchoPeerProcess(lab.leaf.name, duration=60):
        probed = echo_daemon(interval_ms=10)  # a 200-probe loss window fills in 2 s
        wait_for_sync(lambda: assessment(probed.status(), rail0.port, "echo").get("status") == "ok",
                      5.0, "echo up on rail0")
        try:
            lab.leaf.nft(f"""
table inet {table} {{
  chain in {{ type filter hook input priority 0; iifname "{rail0.peer}" numgen random mod 100 < 25 drop; }}
  chain out {{ type filter hook output priority 0; oifname "{rail0.peer}" numgen random mod 100 < 25 drop; }}
}}""")
            wait_for_sync(lambda: lab.host.route_nhid(RAIL0_TABLE) == NH1, 15.0, "rail0 drained")
            wait_for_sync(lambda: assessment(probed.status(), rail0.port, "echo").get("status")
                          == "degraded", 5.0, "echo degraded")
            port = next(p for p in probed.status()["ports"] if p["port"] == rail0.port)
            assert port["verdict"] == "VERDICT_DEGRADED"
            assert lab.host.has_carrier(rail0.port)
            assert lab.host.route_nhid(PROBE0_TABLE) == NH0  # still measured on its own path
        finally:
            lab.leaf.nft(f"delete table inet {table}\n")
        wait_for_sync(lambda: lab.host.route_nhid(RAIL0_TABLE) == NH0, 15.0, "rail0 given back")
        assert assessment(probed.status(), rail0.port, "echo")["status"] == "ok"
