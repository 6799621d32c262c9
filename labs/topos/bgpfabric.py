"""The ``bgp`` fabric as data: a leaf and spine switch that learns host routes
over eBGP from the hosts, the way AI fabrics run BGP to the host.

Every switch runs FRR bgpd (labs/frr.py), each in its own AS (leaf k
``65200 + k``, spine s ``4200000000 + s``, hosts ``65000 + i``), with one
single-hop eBGP session per cable:

- **leaf <-> host port**: the host announces its rail addresses (/32s) over
  it (FRR on the host, driven by linkpassd's ``[announce]``, docs/bgp.md).
  The leaf accepts only /32s inside HOST_SPACE from a host and announces
  nothing to it, so a host never learns fabric routes and never becomes a
  transit. With the lab's ``bfd`` option the session is tracked by BFD
  through a profile with those timers (the leaf's bfdd; the host's BFD
  speaker is linkpassd's agent, so a blackholed port drops the session and
  what was learnt over it).
- **leaf <-> spine**: everything inside HOST_SPACE, both ways: the leaves'
  connected host subnets (``redistribute connected``, the fabric's own
  198.19.0.0/16 links stay out) and the host /32s they learnt.

A spine holds back from the leaves any route with the community
SETTLE_COMMUNITY: what a host's linkpassd sets on a *settling* announcement
(an address on its way home from a detour, docs/bgp.md). So while it settles,
the spine keeps delivering the address through the detour's leaf and the
owner's leaf drops its detour route first: nothing loops between them.

Every switch's zebra (and with linkpassd every host's) runs with
``zebra work-queue 0`` (ZEBRA_CONF): measured in the demo, it took the
reverse flow's blackout on a silent blackhole from 172 to 160 ms (one run each) with the
switches alone. Every
session has ``advertisement-interval 0`` (FRR 8.x's source defaults eBGP
to 0 too, older FRR to 30 s; set explicitly so the intent is written down)
and ``timers connect 1`` (FRR's default retry is 120 s). ECMP:
``maximum-paths`` with ``bgp bestpath as-path multipath-relax``, because the
spines are in different ASes, so a leaf with several spines installs every
equal path.

So the fabric forwards a healthy rail address by its leaf's connected subnet
(the owner's own /32 has its next hop inside it and bgpd holds it invalid),
and a detoured address (announced by the host over another rail's session,
next hop the other rail's address) by that /32: the owner's leaf sends it up
to the spine, the spine to the other rail's leaf, which delivers it over the
host's other port. Nothing in the switches is static beyond their addresses.

Pure: nothing here runs a process. tests/netns/test_announce_fabric.py
builds its own small fabric from the same ``Switch`` definition.
"""

from __future__ import annotations

from dataclasses import dataclass

from labs.frr import BfdProfile
from labs.topos.plan import HOST_SPACE, FabricPlan, LabError, bfd_options

HOST_ASN_BASE = 65000
LEAF_ASN_BASE = 65200
SPINE_ASN_BASE = 4_200_000_000  # RFC 6996 private 4-byte range: up to 256 spines
CONNECT_RETRY_S = 1
MAX_PATHS = 16
# zebra's route-processing hold (FRR 8.4 default 10 ms): 0, so a switch
# installs what bgpd hands it at once. bgpd's own hold (50 ms per bgpd on the
# way, bgp_process_queue_init) has no knob in 8.4.
ZEBRA_CONF = "zebra work-queue 0\n"
# What a host's linkpassd sets on a settling announcement ([announce]
# settle_community), and what the spines hold back from the leaves.
SETTLE_COMMUNITY = "64512:1"


def host_asn(index: int) -> int:
    return HOST_ASN_BASE + index


def leaf_asn(k: int) -> int:
    return LEAF_ASN_BASE + k


def spine_asn(s: int) -> int:
    return SPINE_ASN_BASE + s


@dataclass(frozen=True)
class SwitchPeer:
    """One eBGP session of a switch: toward `address`, sourced from `local`.
    ``host``: the far end is a host port (accept its /32s, send it nothing);
    otherwise another switch (pass on everything in the space). ``bfd``:
    track the session with BFD through this profile."""

    address: str
    local: str
    host: bool
    bfd: BfdProfile | None = None
    ifname: str | None = None  # the switch's port towards a host (host sessions)


@dataclass(frozen=True)
class Switch:
    name: str
    asn: int
    router_id: str
    peers: tuple[SwitchPeer, ...]
    space: str = HOST_SPACE  # what the switch learns and passes on
    spine: bool = False  # holds settling routes back from its peers
    # A leaf that announces `space` itself, as one aggregate, to its host
    # ports (and to nobody else): the route the hosts of the ``frr-bgp``
    # mechanism fail over with (labs/topos/frrbgp.py). Off for linkpassd
    # hosts, which learn nothing from the fabric.
    serves_hosts: bool = False

    @property
    def profiles(self) -> list[BfdProfile]:
        return list(dict.fromkeys(p.bfd for p in self.peers if p.bfd is not None))


def bgpd_config(switch: Switch) -> str:
    """The switch's bgpd.conf. Policy is explicit on every session."""
    out = ["frr defaults traditional", f"hostname {switch.name}", "!",
           f"ip prefix-list lp-space seq 5 permit {switch.space} le 32",
           f"ip prefix-list lp-host-routes seq 5 permit {switch.space} ge 32",
           *([f"ip prefix-list lp-aggregate seq 5 permit {switch.space}", "!",
              # the aggregate goes to host ports only, never to a switch
              "route-map lp-space deny 5", " match ip address prefix-list lp-aggregate"]
             if switch.serves_hosts else []), "!",
           "route-map lp-space permit 10", " match ip address prefix-list lp-space", "!",
           "route-map lp-host-routes permit 10",
           " match ip address prefix-list lp-host-routes", "!",
           "route-map lp-deny deny 10", "!",
           *(["route-map lp-to-host permit 10",
              " match ip address prefix-list lp-aggregate", "!"]
             if switch.serves_hosts else []),
           f"bgp community-list standard lp-settling seq 5 permit {SETTLE_COMMUNITY}", "!",
           "route-map lp-to-leaf deny 5", " match community lp-settling",
           "route-map lp-to-leaf permit 10", " match ip address prefix-list lp-space", "!",
           f"router bgp {switch.asn}", f" bgp router-id {switch.router_id}",
           " bgp bestpath as-path multipath-relax"]
    if switch.serves_hosts:
        out.append(" no bgp network import-check")
    for p in switch.peers:
        out += [f" neighbor {p.address} remote-as external",
                f" neighbor {p.address} update-source {p.local}",
                f" neighbor {p.address} timers connect {CONNECT_RETRY_S}",
                f" neighbor {p.address} advertisement-interval 0"]
        if p.bfd is not None:
            out.append(f" neighbor {p.address} bfd profile {p.bfd.name}")
        if p.ifname is not None:
            # Bound to its port, as BGP unnumbered is: while the host's
            # address is detoured (a /32 through the spine), an unbound
            # session, and the BFD session bgpd asks for it, follows the /32:
            # BGP's TTL 1 and single-hop BFD's TTL 255 check drop it there,
            # so neither comes back until the detour ends. With frr-bgp the
            # detour ends only on their word (the host withdraws it once it
            # learns over the session again), so it never ended (seen in the
            # lab); linkpassd ends it on its own probes, but a session that
            # cannot come back while detoured is wrong for it too.
            out.append(f" neighbor {p.address} interface {p.ifname}")
    out += [" !", " address-family ipv4 unicast",
            "  redistribute connected route-map lp-space",
            f"  maximum-paths {MAX_PATHS}"]
    if switch.serves_hosts:
        out.append(f"  network {switch.space}")
    for p in switch.peers:
        if p.host:
            export = "lp-to-host" if switch.serves_hosts else "lp-deny"
        else:
            export = "lp-to-leaf" if switch.spine else "lp-space"
        out += [f"  neighbor {p.address} route-map "
                f"{'lp-host-routes' if p.host else 'lp-space'} in",
                f"  neighbor {p.address} route-map {export} out"]
    out += [" exit-address-family", "!"]
    return "\n".join(out) + "\n"


def leaf_profile(bfd: dict | None) -> BfdProfile | None:
    """The leaves' BFD profile from the lab's bfd option (None: no BFD)."""
    bfd = bfd_options(bfd)
    if bfd is None:
        return None
    ms = bfd["interval_ms"]
    return BfdProfile(ms, ms, bfd["detect_mult"], passive=bfd["passive"])


def leaf_switch(plan: FabricPlan, name: str, bfd: dict | None, *,
                serves_hosts: bool = False) -> Switch:
    """Leaf `name`: a session per host port (BFD-tracked with the lab's
    timers when ``bfd``) and one per spine; ``serves_hosts``: see Switch."""
    leaf = plan.leaf(name)
    profile = leaf_profile(bfd)
    ports = [plan.host_rail(i, leaf.rail) for i in leaf.hosts]
    peers = [SwitchPeer(p.address, p.gateway, host=True, bfd=profile, ifname=p.leaf_port)
             for p in ports]
    peers += [SwitchPeer(u.spine_address, u.leaf_address, host=False)
              for u in plan.uplinks if u.leaf == leaf.name]
    return Switch(leaf.name, leaf_asn(leaf.index), ports[0].gateway, tuple(peers),
                  serves_hosts=serves_hosts)


def spine_switch(plan: FabricPlan, name: str) -> Switch:
    """Spine `name`: a session per leaf."""
    if name not in plan.spine_names:
        raise LabError(f"no spine {name!r} in this lab (spines: {', '.join(plan.spine_names)})")
    ups = [u for u in plan.uplinks if u.spine == name]
    peers = tuple(SwitchPeer(u.leaf_address, u.spine_address, host=False) for u in ups)
    return Switch(name, spine_asn(ups[0].spine_index), ups[0].spine_address, peers, spine=True)


def switches(plan: FabricPlan, bfd: dict | None, *,
             serves_hosts: bool = False) -> dict[str, Switch]:
    """Every leaf and spine of the plan, by node name (``serves_hosts``:
    the leaves', see Switch)."""
    out = {leaf: leaf_switch(plan, leaf, bfd, serves_hosts=serves_hosts)
           for leaf in plan.leaf_names}
    out.update({spine: spine_switch(plan, spine) for spine in plan.spine_names})
    return out
