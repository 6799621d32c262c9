"""labs.topos.plan's bgp fabric and labs.topos.bgpfabric (pure): the switches
get addresses only and learn everything else over eBGP, each in its own AS,
with BFD on the leaf-host sessions; hosts' /32s in, nothing out to hosts."""

from __future__ import annotations

import pytest

from labs.topos import bgpfabric
from labs.topos.plan import FabricPlan, LabError, linkpassd_toml
from linkpassd.config import parse_config

BFD = {"interval_ms": 100, "detect_mult": 3}


def test_an_unknown_fabric_is_refused_by_name():
    with pytest.raises(LabError, match="fabric must be one of static, bgp"):
        FabricPlan(2, 2, 1, fabric="ospf")


def test_bgp_switches_get_addresses_and_no_static_route():
    bgp, static = FabricPlan(4, 2, 2, fabric="bgp"), FabricPlan(4, 2, 2)
    for node in ("lpl0", "lpl1", "lps0", "lps1"):
        lines = bgp.setup(node, "linkpassd").ip_batch
        assert lines and all(line.startswith("address add ") for line in lines), lines
        assert any(not line.startswith("address add ") for line in static.setup(node, "none").ip_batch)
    # hosts are rendered as in the static fabric
    assert bgp.setup("lph1", "kernel") == static.setup("lph1", "kernel")
    assert "fabric bgp" in bgp.describe().splitlines()[0]


def test_every_switch_has_its_own_as_and_a_session_per_cable():
    plan = FabricPlan(4, 2, 2, leaves_per_rail=2, fabric="bgp")
    switches = bgpfabric.switches(plan, BFD)
    assert set(switches) == set(plan.leaf_names) | set(plan.spine_names)
    assert len({s.asn for s in switches.values()}) == len(switches)
    leaf = switches["lpl1"]  # rail 0, group 1: hosts 3 and 4
    hosts = [p for p in leaf.peers if p.host]
    assert [(p.address, p.local) for p in hosts] == [("198.18.0.7", "198.18.0.6"),
                                                     ("198.18.0.9", "198.18.0.8")]
    assert {p.bfd.name for p in hosts} == {"lp-100-100-3"} and leaf.profiles == [hosts[0].bfd]
    ups = [p for p in leaf.peers if not p.host]
    assert [p.address for p in ups] == [u.spine_address for u in plan.uplinks if u.leaf == "lpl1"]
    spine = switches["lps1"]
    assert all(not p.host and p.bfd is None for p in spine.peers) and spine.profiles == []
    assert len(spine.peers) == len(plan.leaves)
    assert bgpfabric.leaf_switch(plan, "lpl0", None).profiles == []  # no bfd= : no BFD
    with pytest.raises(LabError, match="no spine"):
        bgpfabric.spine_switch(plan, "lps9")


def test_switch_policy_takes_host_routes_from_hosts_and_sends_them_nothing():
    plan = FabricPlan(2, 2, 1, fabric="bgp")
    text = bgpfabric.bgpd_config(bgpfabric.leaf_switch(plan, "lpl0", BFD))
    lines = text.splitlines()
    assert "router bgp 65200" in lines and " bgp bestpath as-path multipath-relax" in lines
    assert "ip prefix-list lp-host-routes seq 5 permit 198.18.0.0/16 ge 32" in lines
    host, spine = "198.18.0.3", "198.19.0.0"
    assert f"  neighbor {host} route-map lp-host-routes in" in lines
    assert f"  neighbor {host} route-map lp-deny out" in lines
    assert f" neighbor {host} bfd profile lp-100-100-3" in lines
    assert f"  neighbor {spine} route-map lp-space in" in lines
    assert f"  neighbor {spine} route-map lp-space out" in lines
    assert not any(line.startswith(f" neighbor {spine} bfd") for line in lines)
    for peer in (host, spine):
        assert f" neighbor {peer} advertisement-interval 0" in lines
        assert f" neighbor {peer} timers connect 1" in lines
    assert "  redistribute connected route-map lp-space" in lines


def test_a_linkpassd_config_with_announce_parses():
    plan = FabricPlan(2, 2, 1, fabric="bgp")
    host = plan.host("lph2")
    text = linkpassd_toml(host, control_socket="/tmp/lp.sock", run_dir="/tmp/lp-run",
                          announce={"local_asn": bgpfabric.host_asn(host.index),
                                    "frr_run_dir": "/tmp/lp-frr"})
    cfg = parse_config(text)
    assert cfg.announce.enabled and cfg.announce.local_asn == 65002
    assert cfg.announce.frr_run_dir == "/tmp/lp-frr"


def test_a_leaf_serving_hosts_sends_them_the_aggregate_only_and_binds_their_sessions():
    plan = FabricPlan(2, 2, 1, fabric="bgp")
    text = bgpfabric.bgpd_config(bgpfabric.leaf_switch(plan, "lpl0", BFD, serves_hosts=True))
    lines = text.splitlines()
    host, spine = "198.18.0.3", "198.19.0.0"
    assert "  network 198.18.0.0/16" in lines and " no bgp network import-check" in lines
    assert f"  neighbor {host} route-map lp-to-host out" in lines
    assert "ip prefix-list lp-aggregate seq 5 permit 198.18.0.0/16" in lines
    # the aggregate never goes to a switch: lp-space denies it first
    deny = lines.index("route-map lp-space deny 5")
    assert lines[deny + 1] == " match ip address prefix-list lp-aggregate"
    assert deny < lines.index("route-map lp-space permit 10")
    assert f"  neighbor {spine} route-map lp-space out" in lines
    # each host session bound to its port, so a detour /32 never carries it
    port = plan.host(1).rail(0).leaf_port
    assert f" neighbor {host} interface {port}" in lines
    assert not any(line.startswith(f" neighbor {spine} interface") for line in lines)
    # a leaf for linkpassd hosts announces them nothing; its sessions are bound too
    plain = bgpfabric.bgpd_config(bgpfabric.leaf_switch(plan, "lpl0", BFD)).splitlines()
    assert f"  neighbor {host} route-map lp-deny out" in plain
    assert not any("lp-aggregate" in line for line in plain)
    assert f" neighbor {host} interface {port}" in plain
