"""The ``frr-bgp`` host routing mechanism as data: each node's bgpd speaker.

The baseline linkpassd is compared with: what a fabric does when hosts run a
routing daemon. Every host runs FRR (zebra + bfdd + bgpd) with one eBGP
session per rail to that rail's leaf, over the rail's /31 (host side
198.18.<r>.<2i+1>, leaf side 198.18.<r>.<2i>), each tracked by BFD through a
profile with the lab's ``bfd=`` timers (FRR 8.4 has no BFD on static routes;
BGP's inline ``bfd`` refuses < 50 ms, a profile takes 10 ms). Every leaf's
bgpd announces HOST_SPACE to its hosts and accepts nothing, so the leaves'
forwarding stays exactly the static plan. A host accepts HOST_SPACE only,
with local preference 200 - r from rail r: rail 0 is the primary and the
other rails back it up in rail order, as linkpassd's rails do. A host
announces nothing (so it never becomes a transit between leaves).

Pure: nothing here runs a process.
"""

from __future__ import annotations

from labs.frr import BfdProfile, BgpNeighbor, BgpSpeaker
from labs.topos.plan import HOST_SPACE, FabricPlan, HostPlan, bfd_options

MECHANISM = "frr-bgp"
# Private 2-byte ASNs (64512-65534): hosts 65001..65127, leaves 65200..65327.
HOST_ASN_BASE = 65000
LEAF_ASN_BASE = 65200
PRIMARY_LOCAL_PREF = 200
CONNECT_RETRY_S = 1  # FRR's default is 120 s: a session would stay down that long


def host_asn(index: int) -> int:
    return HOST_ASN_BASE + index


def leaf_asn(rail: int) -> int:
    return LEAF_ASN_BASE + rail


def rail_local_pref(rail: int) -> int:
    """Rail 0 highest, then the others in rail order (all above BGP's 100)."""
    return PRIMARY_LOCAL_PREF - rail


def profiles(bfd: dict) -> tuple[BfdProfile, BfdProfile]:
    """(host profile, leaf profile) from the lab's bfd option: both with its
    timers; ``passive`` applies to the leaves only (hosts always speak)."""
    bfd = bfd_options(bfd)
    assert bfd is not None
    ms, mult = bfd["interval_ms"], bfd["detect_mult"]
    return BfdProfile(ms, ms, mult), BfdProfile(ms, ms, mult, passive=bfd["passive"])


def host_speaker(host: HostPlan, bfd: dict) -> BgpSpeaker:
    """A host's bgpd: a session per rail with the leaf's half of the /31."""
    profile, _ = profiles(bfd)
    neighbors = tuple(BgpNeighbor(address=rail.gateway, remote_as=leaf_asn(rail.index),
                                  local=rail.address, local_pref=rail_local_pref(rail.index),
                                  bfd=profile) for rail in host.rails)
    return BgpSpeaker(asn=host_asn(host.index), router_id=host.rails[0].address,
                      neighbors=neighbors, accept=(HOST_SPACE,), connect_retry_s=CONNECT_RETRY_S)


def leaf_speaker(plan: FabricPlan, rail: int, bfd: dict) -> BgpSpeaker:
    """Leaf ``rail``'s bgpd: a session per host port, announcing HOST_SPACE."""
    _, profile = profiles(bfd)
    plan.leaf_of(rail)  # LabError for a rail the plan does not have
    ports = [host.rail(rail) for host in plan.hosts]
    neighbors = tuple(BgpNeighbor(address=port.address, remote_as=host_asn(host.index),
                                  local=port.gateway, bfd=profile)
                      for host, port in zip(plan.hosts, ports))
    return BgpSpeaker(asn=leaf_asn(rail), router_id=ports[0].gateway, neighbors=neighbors,
                      originate=(HOST_SPACE,), connect_retry_s=CONNECT_RETRY_S)
