"""[announce] in a rail-optimised fabric that learns host routes: one host
(lprail0 to leaf0, lprail1 to leaf1), two leaves in their own ASes and one
spine, every switch an FRR bgpd passing host /32s on, configured as the
lab's bgp fabric configures its switches (labs/topos/bgpfabric.py). No
static detour.

Shows: healthy, the fabric reaches 198.18.0.2 by leaf0's connected subnet
(the own-rail /32 is invalid on leaf0: its next hop is inside it); when
linkpassd distrusts rail0 (gray: the sessions stay up),
leaf0 itself, the owner rail's leaf, forwards 198.18.0.2 up to the spine and
the spine down to leaf1, which delivers it over the host's rail1 port; back
when rail0 is trusted again. The lab's bgp fabric (labs/demo.py) is this at
the dualrail's size; the static lab's detour (FabricPlan.detour) only stood
in for it.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import replace

import pytest

from labs.frr import FrrBfd
from labs.netnslib import run, wait_for_sync
from labs.topos import bgpfabric
from linkpassd.adapters.announce import Announcer
from linkpassd.announce_frr import bgpd_config, zebra_config
from linkpassd.config import parse_config
from linkpassd.core import announce, policy
from linkpassd.core.model import PortState, Verdict

pytestmark = pytest.mark.netns

HOST_ASN, LEAF_ASN, SPINE_ASN = 65101, 65200, 65300
TIMEOUT_S = 20.0


def switch_bgpd(name: str, asn: int, router_id: str, neighbors: list[tuple[str, str, bool]],
                spine: bool = False) -> str:
    """A switch of the lab's bgp fabric (labs/topos/bgpfabric.py): announces
    its connected subnets and passes on host routes (anything in
    198.18.0.0/16) with every neighbour (address, source address, whether it
    is a host port: a host's /32s are accepted, nothing is sent to it)."""
    return bgpfabric.bgpd_config(bgpfabric.Switch(
        name, asn, router_id,
        tuple(bgpfabric.SwitchPeer(addr, local, host=host) for addr, local, host in neighbors),
        spine=spine))


def bgp_gateways(ns, address: str) -> list[str]:
    routes = [r for r in ns.ipj("route", "show", "proto", "bgp") if r.get("dst") == address]
    return sorted(nh.get("gateway") for r in routes for nh in (r.get("nexthops") or [r])
                  if nh.get("gateway"))


def _path(frr: FrrBfd, address: str) -> dict | None:
    """The first BGP path for address/32 in `frr`, as bgpd shows it."""
    out = frr.try_read(lambda: json.loads(frr.vtysh(f"show bgp ipv4 unicast {address}/32 json")))
    paths = (out or {}).get("paths", [])
    return paths[0] if paths else None


def wait(pred, what: str, timeout: float = TIMEOUT_S):
    return wait_for_sync(pred, timeout, what)


def veth(a, a_if: str, a_addr: str, b, b_if: str, b_addr: str) -> None:
    a.ip("link", "add", a_if, "type", "veth", "peer", "name", b_if, "netns", b.name)
    a.ip("addr", "add", a_addr, "dev", a_if)
    b.ip("addr", "add", b_addr, "dev", b_if)
    a.ip("link", "set", a_if, "up")
    b.ip("link", "set", b_if, "up")


def test_owner_leaf_reaches_a_detoured_address_through_the_spine(netns_factory):
    host, leaf0, leaf1, spine = (netns_factory(t) for t in ("h", "l", "l", "s"))
    veth(host, "lprail0", "198.18.0.2/24", leaf0, "lpleaf0", "198.18.0.1/24")
    veth(host, "lprail1", "198.18.1.2/24", leaf1, "lpleaf1", "198.18.1.1/24")
    veth(leaf0, "lpup0", "198.18.100.0/31", spine, "lpspine0", "198.18.100.1/31")
    veth(leaf1, "lpup1", "198.18.100.2/31", spine, "lpspine1", "198.18.100.3/31")
    for ns in (leaf0, leaf1, spine):
        for key in ("net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0"):
            subprocess.run(["ip", "netns", "exec", ns.name, "sysctl", "-qw", key], check=True,
                           timeout=10)
    a0, a1 = "198.18.0.2", "198.18.1.2"
    cfg = parse_config(
        '[daemon]\ncontrol_socket = "/tmp/lp-unused.sock"\n'
        f'[announce]\nenabled = true\nlocal_asn = {HOST_ASN}\n'
        f'settle_community = "{bgpfabric.SETTLE_COMMUNITY}"\n'
        '[[rail]]\nname = "rail0"\nport = "lprail0"\naddress = "198.18.0.2/24"\n'
        'gateway = "198.18.0.1"\nbackups = ["rail1"]\n'
        '[[rail]]\nname = "rail1"\nport = "lprail1"\naddress = "198.18.1.2/24"\n'
        'gateway = "198.18.1.1"\nbackups = ["rail0"]\n')
    frrs = {
        "host": FrrBfd(host.name, [], zebra_conf=zebra_config(cfg),
                       bgpd_conf="frr defaults traditional\nhostname lp-host\n!\n"
                       + bgpd_config(cfg)),
        "leaf0": FrrBfd(leaf0.name, [], bgpd_conf=switch_bgpd(
            "lp-leaf0", LEAF_ASN, "198.18.0.1",
            [(a0, "198.18.0.1", True), ("198.18.100.1", "198.18.100.0", False)])),
        "leaf1": FrrBfd(leaf1.name, [], bgpd_conf=switch_bgpd(
            "lp-leaf1", LEAF_ASN + 1, "198.18.1.1",
            [(a1, "198.18.1.1", True), ("198.18.100.3", "198.18.100.2", False)])),
        "spine": FrrBfd(spine.name, [], bgpd_conf=switch_bgpd(
            "lp-spine", SPINE_ASN, "198.18.100.1",
            [("198.18.100.0", "198.18.100.1", False), ("198.18.100.2", "198.18.100.3", False)],
            spine=True)),
    }
    report: dict = {}
    try:
        for frr in frrs.values():
            frr.start()
        cfg = replace(cfg, announce=replace(cfg.announce,
                                            frr_run_dir=str(frrs["host"].run_dir)))
        for name, frr in frrs.items():
            wait(lambda frr=frr: set(frr.bgp_states().values()) == {"Established"},
                 f"{name}'s sessions up", 40.0)

        def decide(previous=None, now=0.0, **verdicts):
            states = {r.port: PortState(r.port, verdicts.get(r.port, Verdict.UP), True, "x", 0.0)
                      for r in cfg.rails}
            return announce.plan(cfg, cfg.announce, policy.decide(cfg, states).rails,
                                 previous, now)

        async def write(plan):
            ipr = host.iproute()
            async with ipr:
                result = await Announcer(ipr, cfg.announce, cfg.announce.frr_run_dir).apply(cfg, plan)
            assert result.errors == [] and result.refused == []

        run(write(decide()), timeout=30)
        # Healthy: the fabric reaches each rail address by its leaf's subnet.
        # The own-rail /32 is not used by the owner's leaf: its next hop (the
        # address itself) lies inside the prefix, so bgpd holds it invalid.
        wait(lambda: bgp_gateways(spine, "198.18.0.0/24") == ["198.18.100.0"]
             and bgp_gateways(spine, "198.18.1.0/24") == ["198.18.100.2"], "spine learns subnets")
        time.sleep(1.0)
        assert bgp_gateways(spine, a0) == [] and bgp_gateways(leaf0, a0) == []
        assert _path(frrs["leaf0"], a0)["valid"] is False  # held, not used

        t = time.monotonic()
        detoured = decide(lprail0=Verdict.DEGRADED)
        run(write(detoured), timeout=30)
        wait(lambda: bgp_gateways(leaf0, a0) == ["198.18.100.1"]
             and bgp_gateways(spine, a0) == ["198.18.100.2"]
             and bgp_gateways(leaf1, a0) == [a1], "rail0's address through the spine to leaf1")
        report["owner_leaf_via_spine_s"] = round(time.monotonic() - t, 3)
        route = leaf0.ipj("route", "get", a0)[0]
        assert (route.get("gateway"), route.get("dev")) == ("198.18.100.1", "lpup0")
        assert all(set(f.bgp_states().values()) == {"Established"} for f in frrs.values())

        # Trusted again: settling first. The address stays on rail1's session
        # with the settling community, which the spine holds back from the
        # leaves: leaf0 forgets the detour first, the spine and leaf1 keep
        # delivering it over rail1 meanwhile, so no hop ever loops it back.
        t = time.monotonic()
        settling = decide(detoured, now=100.0)
        assert settling[a0].role is announce.Role.SETTLING and settling[a0].via == "rail1"
        run(write(settling), timeout=30)
        wait(lambda: bgp_gateways(leaf0, a0) == [] and bgp_gateways(spine, a0) == ["198.18.100.2"]
             and bgp_gateways(leaf1, a0) == [a1], "settling: leaf0 drops the detour first")
        report["settled_s"] = round(time.monotonic() - t, 3)
        route = leaf0.ipj("route", "get", a0)[0]
        assert route.get("dev") == "lpleaf0" and "gateway" not in route

        t = time.monotonic()
        home = decide(settling, now=100.0 + cfg.announce.settle_s)
        assert home[a0].role is announce.Role.OWNER
        run(write(home), timeout=30)
        wait(lambda: bgp_gateways(leaf0, a0) == [] and bgp_gateways(spine, a0) == []
             and bgp_gateways(leaf1, a0) == [], "back on rail0")
        report["back_s"] = round(time.monotonic() - t, 3)
        route = leaf0.ipj("route", "get", a0)[0]
        assert route.get("dev") == "lpleaf0" and "gateway" not in route
    except BaseException:
        for name, frr in frrs.items():
            print(f"==== {name} bgp\n", frr.try_read(lambda frr=frr: frr.vtysh("show bgp ipv4 unicast")))
        print("spine routes", spine.ip("route"))
        print("leaf0 routes", leaf0.ip("route"))
        for name, frr in frrs.items():
            print(f"==== {name}\n{frr.logs()}")
        raise
    finally:
        for frr in frrs.values():
            try:
                frr.stop()
            finally:
                frr.cleanup()
    print("announce fabric:", report)
