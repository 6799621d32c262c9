"""The frr-bgp mechanism's generated FRR configs, as text (no lab, no root).

What the lab relies on: a host peers with every rail's leaf from that rail's
address, prefers rail 0 and then the rails in order, accepts only the host
space and announces nothing; a leaf announces the host space only, accepts
nothing (its forwarding stays the static plan), and every session is tracked
by BFD through a profile with the lab's timers. When FRR is installed, bgpd's
own parser (a dry run, ``-C``) must accept every line: FRR drops a line it
refuses with a log message and runs on without it.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from labs.frr import BfdPeer, BfdProfile, bfdd_config, bgpd_config
from labs.topos import frrbgp
from labs.topos.lab import Lab
from labs.topos.plan import HOST_SPACE, MECHANISMS, FabricPlan, LabError

BFD = {"interval_ms": 300, "detect_mult": 3}
BGPD = Path("/usr/lib/frr/bgpd")
# How FRR reports a config line it did not take ("No such command on config
# line 20: ...", "Config Failed on config line ...").
REFUSED = " on config line "


def lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines()]


def test_mechanism_is_listed_and_needs_bfd():
    assert "frr-bgp" in MECHANISMS
    with pytest.raises(LabError, match="BFD"):
        Lab(FabricPlan(2, 2, 1), "frr-bgp")


def test_hosts_get_addresses_only():
    """No static route and no rule: every fabric route comes from FRR."""
    setup = FabricPlan(2, 2, 1).setup("lph1", "frr-bgp")
    assert setup.ip_batch == ["address add 198.18.0.3/31 dev lph1-eth0",
                              "address add 198.18.1.3/31 dev lph1-eth1"]


def test_leaves_keep_the_static_plan():
    plan = FabricPlan(4, 2, 2)
    for leaf in plan.leaf_names:
        assert plan.setup(leaf, "frr-bgp") == plan.setup(leaf, "none")


def test_host_speaker_prefers_rail_zero_then_rail_order():
    plan = FabricPlan(3, 3, 1)
    host = plan.host("lph2")
    speaker = frrbgp.host_speaker(host, BFD)
    assert speaker.asn == 65002 and speaker.router_id == "198.18.0.5"
    assert speaker.accept == (HOST_SPACE,) and speaker.originate == ()
    assert [(n.address, n.remote_as, n.local, n.local_pref) for n in speaker.neighbors] == [
        ("198.18.0.4", 65200, "198.18.0.5", 200),
        ("198.18.1.4", 65201, "198.18.1.5", 199),
        ("198.18.2.4", 65202, "198.18.2.5", 198)]
    assert {n.bfd for n in speaker.neighbors} == {BfdProfile(300, 300, 3)}
    text = lines(bgpd_config(speaker))
    assert "router bgp 65002" in text
    for r, n in enumerate(speaker.neighbors):
        assert f"neighbor {n.address} bfd profile lp-300-300-3" in text
        assert f"neighbor {n.address} update-source {n.local}" in text
        assert f"neighbor {n.address} timers connect 1" in text
        assert f"neighbor {n.address} route-map lp-accept-pref{200 - r} in" in text
        assert f"neighbor {n.address} route-map lp-deny out" in text  # announces nothing
        assert f"set local-preference {200 - r}" in text
    assert "ip prefix-list lp-accept seq 5 permit 198.18.0.0/16" in text
    assert not any(line.startswith("network ") for line in text)


def test_leaf_speaker_announces_the_host_space_and_accepts_nothing():
    plan = FabricPlan(2, 2, 1)
    speaker = frrbgp.leaf_speaker(plan, 1, {**BFD, "passive": True})
    assert speaker.asn == 65201 and speaker.router_id == "198.18.1.2"
    assert [(n.address, n.remote_as, n.local) for n in speaker.neighbors] == [
        ("198.18.1.3", 65001, "198.18.1.2"), ("198.18.1.5", 65002, "198.18.1.4")]
    assert {n.bfd for n in speaker.neighbors} == {BfdProfile(300, 300, 3, passive=True)}
    text = lines(bgpd_config(speaker))
    assert "network 198.18.0.0/16" in text and "no bgp network import-check" in text
    for n in speaker.neighbors:
        assert f"neighbor {n.address} route-map lp-deny in" in text
        assert f"neighbor {n.address} route-map lp-export out" in text
        assert f"neighbor {n.address} bfd profile lp-300-300-3-passive" in text
    assert "ip prefix-list lp-originate seq 5 permit 198.18.0.0/16" in text
    assert not any("local-preference" in line for line in text)
    with pytest.raises(LabError):
        frrbgp.leaf_speaker(plan, 2, BFD)


def test_bfdd_gets_the_profile_bgpd_names():
    profile = BfdProfile(50, 50, 3)
    text = bfdd_config([], [profile, profile])
    assert text == ("bfd\n profile lp-50-50-3\n  transmit-interval 50\n"
                    "  receive-interval 50\n  detect-multiplier 3\n !\n!\n")


def test_bfdd_config_for_static_peers_is_unchanged():
    """What the leaves without BGP have always been given."""
    peer = BfdPeer("198.18.0.3", "198.18.0.2", "lpl0-eth0", 100, 100, 3, passive=True)
    assert peer.profile == "lp-100-100-3-passive"
    assert bfdd_config([peer]) == (
        "bfd\n profile lp-100-100-3-passive\n  transmit-interval 100\n"
        "  receive-interval 100\n  detect-multiplier 3\n  passive-mode\n !\n"
        " peer 198.18.0.3 local-address 198.18.0.2 interface lpl0-eth0\n"
        "  profile lp-100-100-3-passive\n !\n!\n")


def bgpd_dry_run(config: str) -> str:
    """bgpd -C on `config`: parse and exit, with no zebra (-Z), no BGP
    listener (-p 0), no TCP vty (-P 0) and no privilege change (-S). bgpd
    leaves a crash-log directory named after its PID under /var/tmp/frr;
    that one (only) is removed."""
    with tempfile.TemporaryDirectory(prefix="lp-bgpd-C-") as tmp:
        conf = Path(tmp, "bgpd.conf")
        conf.write_text(config)
        proc = subprocess.Popen([str(BGPD), "-C", "-Z", "-S", "-p", "0", "-P", "0",
                                 "--vty_socket", tmp, "-i", str(Path(tmp, "bgpd.pid")),
                                 "-f", str(conf), "--log", "stdout"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out, _ = proc.communicate(timeout=20)
        crashlog = Path(f"/var/tmp/frr/bgpd.{proc.pid}")
        if crashlog.is_dir() and not any(crashlog.iterdir()):
            crashlog.rmdir()
    assert proc.returncode == 0, out
    return out


@pytest.mark.skipif(not BGPD.exists() or os.geteuid() != 0,
                    reason="needs FRR's bgpd and root")
def test_bgpd_accepts_every_generated_line():
    plan = FabricPlan(2, 2, 1)
    for speaker in [frrbgp.host_speaker(h, BFD) for h in plan.hosts] + \
            [frrbgp.leaf_speaker(plan, r, BFD) for r in range(plan.n_rails)]:
        out = bgpd_dry_run(bgpd_config(speaker))
        assert REFUSED not in out, out
    # ...and the dry run does flag a refused line, so the check above means something.
    bad = bgpd_config(frrbgp.host_speaker(plan.host(1), BFD))
    assert REFUSED in bgpd_dry_run(bad.replace("timers connect 1", "timers connect 0"))
    assert REFUSED in bgpd_dry_run(bad.replace("update-source", "update-sauce"))


# ---- frr-bgp on the bgp fabric (frrbgp.fabric_host_bgpd) ------------------------

LEAF_ASNS = {0: 65200, 1: 65201}


def test_on_the_bgp_fabric_a_host_announces_each_rail_and_backs_it_up_conditionally():
    host = FabricPlan(2, 2, 1, fabric="bgp").host(1)
    text = lines(frrbgp.fabric_host_bgpd(host, BFD, LEAF_ASNS))
    a0, a1 = host.rail(0).address, host.rail(1).address
    g0, g1 = host.rail(0).gateway, host.rail(1).gateway
    assert f"network {a0}/32" in text and f"network {a1}/32" in text
    # own addresses only, on every session...
    assert f"neighbor {g0} route-map lp-own out" in text
    assert f"neighbor {g1} route-map lp-own out" in text
    assert f"ip prefix-list lp-own seq 5 permit {a0}/32" in text
    # ...rail 1's address over rail 0 only while nothing is learnt from rail 1's
    # leaf, and the other way round
    assert f"neighbor {g0} advertise-map lp-backup-rail1 non-exist-map lp-via-leaf1" in text
    assert f"neighbor {g1} advertise-map lp-backup-rail0 non-exist-map lp-via-leaf0" in text
    assert f"ip prefix-list lp-leaf0 seq 5 permit {g0}/32" in text
    assert f"bgp conditional-advertisement timer {frrbgp.CONDITION_TIMER_S}" in text
    # outgoing: the leaves' aggregate, rail 0 first; BFD on both sessions
    assert "set local-preference 200" in text and "set local-preference 199" in text
    assert f"neighbor {g0} remote-as 65200" in text and f"neighbor {g1} remote-as 65201" in text
    assert f"neighbor {g0} bfd profile lp-300-300-3" in text


def test_on_the_bgp_fabric_frr_bgp_needs_two_rails():
    with pytest.raises(LabError, match="exactly 2 rails"):
        frrbgp.fabric_host_bgpd(FabricPlan(2, 3, 1, fabric="bgp").host(1), BFD,
                                {0: 65200, 1: 65201, 2: 65202})
    with pytest.raises(LabError, match="needs 2 rails, not 3"):
        Lab(FabricPlan(2, 3, 1, fabric="bgp"), "frr-bgp", bfd=BFD)


@pytest.mark.skipif(not BGPD.exists() or os.geteuid() != 0,
                    reason="needs FRR's bgpd and root")
def test_bgpd_accepts_every_line_of_the_fabric_host_config():
    host = FabricPlan(2, 2, 1, fabric="bgp").host(2)
    out = bgpd_dry_run(frrbgp.fabric_host_bgpd(host, BFD, LEAF_ASNS))
    assert REFUSED not in out, out
