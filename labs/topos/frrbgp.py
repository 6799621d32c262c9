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
from labs.topos.plan import HOST_SPACE, FabricPlan, HostPlan, LabError, bfd_options

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


# ---- on the bgp fabric (labs/topos/bgpfabric.py) ---------------------------------

# How often bgpd re-checks a conditional advertisement's condition: FRR's
# smallest (`bgp conditional-advertisement timer`, 5-240 s, default 60).
CONDITION_TIMER_S = 5


def fabric_host_bgpd(host: HostPlan, bfd: dict, leaf_asns: dict[int, int]) -> str:
    """A host's bgpd.conf on the bgp fabric: the best FRR does alone, both
    ways, with eBGP and BFD to each rail's leaf (``leaf_asns``: rail -> the
    leaf's AS).

    Outgoing: as on the static fabric, the leaves announce HOST_SPACE (the
    fabric's ``serves_hosts``) and the host takes it with local preference
    200 - r, so BFD taking a session down moves the host's traffic to the
    next rail.

    Incoming: each rail's address is announced over its own rail's session
    always, and over each other rail's session only while the host holds no
    route from the first rail's leaf (a conditional advertisement:
    ``advertise-map`` with a ``non-exist-map`` matching HOST_SPACE with the
    leaf's next hop). bgpd checks that condition every CONDITION_TIMER_S,
    its shortest, so the fabric learns a detour up to that long after BFD
    ended the session. FRR allows one ``advertise-map`` per session, so this
    covers hosts with two rails (LabError otherwise)."""
    if len(host.rails) != 2:
        raise LabError(f"{host.name}: frr-bgp on the bgp fabric backs each rail up with the "
                       f"other one: it needs exactly 2 rails, not {len(host.rails)}")
    profile, _ = profiles(bfd)
    out = ["frr defaults traditional", f"hostname {host.name}", "!",
           f"ip prefix-list lp-accept seq 5 permit {HOST_SPACE}"]
    out += [f"ip prefix-list lp-own seq {5 * (k + 1)} permit {rail.address}/32"
            for k, rail in enumerate(host.rails)]
    for rail in host.rails:
        out += [f"ip prefix-list lp-rail{rail.index} seq 5 permit {rail.address}/32",
                f"ip prefix-list lp-leaf{rail.index} seq 5 permit {rail.gateway}/32"]
    out += ["!", "route-map lp-own permit 10", " match ip address prefix-list lp-own", "!"]
    for rail in host.rails:
        out += [f"route-map lp-accept-rail{rail.index} permit 10",
                " match ip address prefix-list lp-accept",
                f" set local-preference {rail_local_pref(rail.index)}", "!",
                f"route-map lp-backup-rail{rail.index} permit 10",
                f" match ip address prefix-list lp-rail{rail.index}", "!",
                f"route-map lp-via-leaf{rail.index} permit 10",
                " match ip address prefix-list lp-accept",
                f" match ip next-hop prefix-list lp-leaf{rail.index}", "!"]
    out += [f"router bgp {host_asn(host.index)}", f" bgp router-id {host.rails[0].address}",
            " no bgp network import-check",
            f" bgp conditional-advertisement timer {CONDITION_TIMER_S}"]
    for rail in host.rails:
        out += [f" neighbor {rail.gateway} remote-as {leaf_asns[rail.index]}",
                f" neighbor {rail.gateway} update-source {rail.address}",
                f" neighbor {rail.gateway} timers connect {CONNECT_RETRY_S}",
                f" neighbor {rail.gateway} advertisement-interval 0",
                f" neighbor {rail.gateway} bfd profile {profile.name}"]
    out += [" !", " address-family ipv4 unicast"]
    out += [f"  network {rail.address}/32" for rail in host.rails]
    for rail in host.rails:
        other = host.rails[1 - rail.index].index
        out += [f"  neighbor {rail.gateway} activate",
                f"  neighbor {rail.gateway} route-map lp-accept-rail{rail.index} in",
                f"  neighbor {rail.gateway} route-map lp-own out",
                f"  neighbor {rail.gateway} advertise-map lp-backup-rail{other} "
                f"non-exist-map lp-via-leaf{other}"]
    out += [" exit-address-family", "!"]
    return "\n".join(out) + "\n"
