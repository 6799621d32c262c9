"""The rail-optimised fabric as data: names, addresses, routes, sysctls.

Pure (no system calls), so the addressing can be read, printed and checked
without root, and the Lab only *writes* what this module renders (build ->
render -> write, as ipmininet does).

Shape: N hosts x R rails, L leaves per rail (default 1), S spines. The hosts
are split into L contiguous groups of near-equal size (group sizes differ by
at most one); group g's port on rail r is cabled to leaf k = r*L + g, and
every leaf is cabled to every spine: the real rail-optimised shape, where
same-rail traffic between two groups crosses a spine. With L = 1 (the
default) leaf k is rail r's only leaf and everything below is as it always
was.

Addressing (everything inside 198.18.0.0/15, RFC 2544; j is host i's place
in its group, P = ceil(N/L) the leaves' host-port count):

  host i (1-based) on rail r   host port ``lph<i>-eth<r>``  198.18.<r>.<2i+1>/31
                               leaf port ``lpl<k>-eth<j>``   198.18.<r>.<2i>/31
  leaf k <-> spine s           leaf port ``lpl<k>-eth<P+s>`` 198.19.<s>.<2k+1>/31
                               spine port ``lps<s>-eth<k>``  198.19.<s>.<2k>/31

so rail r's host space is 198.18.<r>.0/24 and a host's gateway on rail r is
the leaf half of its /31.  198.19.0.0/16 is the fabric's own (leaf-spine)
space; no host sends to it.  MACs are fixed too: ``02:4c:50:<role>:<node>:<port>``
(role 1 host, 2 leaf, 3 spine), so a neighbour MAC names the port it belongs to.

ECMP: a leaf spreads what goes up over all its spine links (a multipath
route). With several leaves per rail the leaves and spines hash on the
5-tuple (``fib_multipath_hash_policy = 1``), as RoCE fabrics do (RoCEv2
carries its flow entropy in the UDP source port), so probes from several
source ports between one host pair take several spines. Single-leaf rails
keep the kernel's default (addresses only), so the failover labs' paths
are what they always were.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from functools import cached_property

# frr-bgp: FRR's eBGP + BFD per rail (labs/topos/frrbgp.py), the baseline.
MECHANISMS = ("none", "kernel", "linkpassd", "frr-bgp")
# How the leaves and spines route (FabricPlan.fabric).
FABRICS = ("static", "bgp")

HOST, LEAF, SPINE = "lph", "lpl", "lps"
#: Every interface and node this lab creates matches this; teardown checks it.
LAB_NAME_RE = re.compile(r"^lp[hls]\d+(-eth\d+)?$")

HOST_SPACE = "198.18.0.0/16"  # all rails' host /31s
FABRIC_SPACE = "198.18.0.0/15"  # everything the lab may address

# Host routing for the static mechanisms (outside linkpassd's default ranges).
RAIL_TABLE_BASE = 1000
RAIL_RULE_PREF = 1000
# Fabric detour (see FabricPlan.detour).
DETOUR_TABLE_BASE = 2000
DETOUR_RULE_PREF = 2000

# What FRR 8.4's bfdd profile accepts (checked with `bfdd -C`); a value outside
# is not an error to FRR: it drops the config line with a log message and
# runs its defaults (300 ms x 3), so the lab refuses it up front.
BFD_INTERVAL_MS = (10, 60_000)
BFD_DETECT_MULT = (2, 255)

MAX_HOSTS = 127  # 2i+1 <= 255
MAX_RAILS = 128  # 2r+1 <= 255 on the spine links
MAX_LEAVES = 128  # all rails' leaves: 2k+1 <= 255 on the spine links
MAX_SPINES = 256


class LabError(ValueError):
    """A topology that cannot be addressed, or a host/rail that does not exist."""


def bfd_options(bfd: dict | None) -> dict | None:
    """A lab's ``bfd`` option, checked: ``interval_ms`` and ``detect_mult``
    (required ints, FRR's profile ranges) and ``passive`` (bool, default
    False: the leaves speak first). None means no BFD anywhere."""
    if bfd is None:
        return None
    if not isinstance(bfd, dict):
        raise LabError(f"bfd must be a dict or None, got {bfd!r}")
    unknown = set(bfd) - {"interval_ms", "detect_mult", "passive"}
    if unknown:
        raise LabError(f"unknown bfd option(s) {', '.join(sorted(unknown))} "
                       "(known: interval_ms, detect_mult, passive)")
    out = {"interval_ms": bfd.get("interval_ms"), "detect_mult": bfd.get("detect_mult"),
           "passive": bfd.get("passive", False)}
    for key, (lo, hi) in (("interval_ms", BFD_INTERVAL_MS), ("detect_mult", BFD_DETECT_MULT)):
        value = out[key]
        if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
            raise LabError(f"bfd {key} must be an integer in {lo}..{hi}, got {value!r}")
    if not isinstance(out["passive"], bool):
        raise LabError(f"bfd passive must be a bool, got {out['passive']!r}")
    return out


def mac(role: int, node: int, port: int) -> str:
    return f"02:4c:50:{role:02x}:{node:02x}:{port:02x}"


@dataclass(frozen=True)
class HostRail:
    """One host port: what a fault, a traffic generator or linkpassd needs."""

    index: int  # rail number r
    name: str  # linkpassd rail name, "rail<r>"
    port: str  # host interface
    address: str  # host address, no prefix
    prefixlen: int
    gateway: str  # the leaf half of the /31
    leaf: str  # leaf node name
    leaf_port: str  # the leaf's interface facing this host port
    mac: str
    leaf_mac: str
    ifindex: int  # same index on both ends, see FabricPlan.link_ifindex

    @property
    def interface(self) -> str:
        return f"{self.address}/{self.prefixlen}"

    @property
    def subnet(self) -> str:
        return str(ipaddress.ip_interface(self.interface).network)


@dataclass(frozen=True)
class HostPlan:
    name: str
    index: int  # 1-based
    rails: tuple[HostRail, ...]

    def rail(self, r: int | str) -> HostRail:
        for rail in self.rails:
            if r in (rail.index, rail.name, rail.port):
                return rail
        raise LabError(f"{self.name} has no rail {r!r} (rails: "
                        f"{', '.join(str(x.index) for x in self.rails)})")

    @property
    def addresses(self) -> list[str]:
        return [rail.address for rail in self.rails]


@dataclass(frozen=True)
class LeafPlan:
    """One leaf: its rail, its group of hosts and its ports."""

    name: str
    index: int  # k = rail * leaves_per_rail + group
    rail: int
    group: int
    hosts: tuple[int, ...]  # 1-based host indexes, in port order

    def port(self, position: int) -> str:
        return f"{self.name}-eth{position}"


@dataclass(frozen=True)
class Uplink:
    leaf: str
    spine: str
    rail: int
    spine_index: int
    leaf_port: str
    spine_port: str
    leaf_address: str
    spine_address: str
    leaf_mac: str
    spine_mac: str
    ifindex: int
    leaf_index: int = 0  # k; equals rail with one leaf per rail


@dataclass(frozen=True)
class NodeSetup:
    """What one node needs: sysctls, then `ip -batch` lines, in order."""

    sysctls: dict[str, str] = field(default_factory=dict)
    ip_batch: list[str] = field(default_factory=list)


def _multipath(hops: list[tuple[str, str]]) -> str:
    """`via X dev Y` for one hop, legacy `nexthop via .. nexthop via ..` for more."""
    if len(hops) == 1:
        gw, dev = hops[0]
        return f"via {gw} dev {dev}"
    return " ".join(f"nexthop via {gw} dev {dev}" for gw, dev in hops)


@dataclass(frozen=True)
class FabricPlan:
    """N hosts x R rails, ``leaves_per_rail`` leaves per rail (module doc), S spines.

    ``fabric``: how the leaves and spines route.

    - ``bgp``: every leaf and spine runs FRR bgpd (labs/topos/bgpfabric.py):
      eBGP on every cable, each switch its own AS, host /32s learnt from the
      hosts (with BFD on the leaf-host sessions when the lab has ``bfd``),
      connected host subnets passed on, ECMP over the spines. The plan
      renders only the switches' addresses and sysctls; every switch route
      is BGP's. A host address moves only when the host announces it
      elsewhere (linkpassd's ``[announce]``). The default of the labs that
      measure the reverse flow (labs/scenario.py: the demo, the failover
      bench, tests/labs/test_failover_lab.py and test_fleet_away.py).
    - ``static`` (the default here): the routes below, written once, and the
      ``detour``. Kept for the labs whose hosts run no BGP speaker of
      linkpassd's and that never measure traffic into a faulted rail (the
      fleet, validation, hiccup and probing labs), for the ``frr-bgp``
      baseline (its leaves run their own bgpd, labs/topos/frrbgp.py), and for
      tests/labs/test_topos_faults.py's
      test_kernel_mechanism_survives_a_cable_pull_through_the_fabric_detour,
      which needs the detour itself.

    ``detour`` (static fabric only): when a host's link to leaf r is down, leaf r hands traffic for
    that host's rail-r address to the spine (its ``default`` table, consulted
    only after main misses), the spine sends it to leaf (r+1) mod R, and that
    leaf delivers it over the host's rail-(r+1) port. Without it a host
    address on a dead link is unreachable, so no host-side failover can keep
    an established flow alive (its replies are addressed to the dead rail).
    It is the static stand-in for a fabric that learns host routes (BGP to the
    host). It only reacts to carrier loss: a silent blackhole still eats the
    replies, as it would in a real fabric without switch-side BFD. Double
    failures (rails r and r+1 of one host) end in ICMP unreachable, not a loop.
    With several leaves per rail the detour goes to the same group's leaf on
    rail r+1 (a host's ports sit in the same group on every rail).
    """

    n_hosts: int
    n_rails: int
    n_spines: int
    detour: bool = True
    leaves_per_rail: int = 1
    fabric: str = "static"

    def __post_init__(self) -> None:
        if self.fabric not in FABRICS:
            raise LabError(f"fabric must be one of {', '.join(FABRICS)}, got {self.fabric!r}")
        for what, value, hi in (("hosts", self.n_hosts, MAX_HOSTS),
                                ("rails", self.n_rails, MAX_RAILS),
                                ("spines", self.n_spines, MAX_SPINES)):
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= hi:
                raise LabError(f"{what} must be an integer in 1..{hi}, got {value!r}")
        per = self.leaves_per_rail
        if not isinstance(per, int) or isinstance(per, bool) or not 1 <= per <= self.n_hosts:
            raise LabError(f"leaves_per_rail must be an integer in 1..hosts ({self.n_hosts}), "
                           f"got {per!r}")
        if self.n_rails * per > MAX_LEAVES:
            raise LabError(f"rails x leaves_per_rail must be <= {MAX_LEAVES} (spine link "
                           f"addresses), got {self.n_rails} x {per}")
        if self.hosts_per_leaf + self.n_spines > 256:
            raise LabError("hosts per leaf + spines must be <= 256 (leaf port numbers)")

    # ---- names ---------------------------------------------------------------

    @property
    def host_names(self) -> list[str]:
        return [f"{HOST}{i}" for i in range(1, self.n_hosts + 1)]

    @property
    def leaf_names(self) -> list[str]:
        return [leaf.name for leaf in self.leaves]

    @property
    def hosts_per_leaf(self) -> int:
        """The largest group: every leaf's uplinks start at this port number."""
        return -(-self.n_hosts // self.leaves_per_rail)

    def _group_start(self, g: int) -> int:
        """0-based index of group g's first host (near-equal contiguous groups)."""
        return g * self.n_hosts // self.leaves_per_rail

    def group_of(self, i: int) -> int:
        """Host i's (1-based) group: the same on every rail."""
        g = (i - 1) * self.leaves_per_rail // self.n_hosts
        while self._group_start(g + 1) <= i - 1:
            g += 1
        while self._group_start(g) > i - 1:
            g -= 1
        return g

    @cached_property
    def leaves(self) -> tuple[LeafPlan, ...]:
        out = []
        for r in range(self.n_rails):
            for g in range(self.leaves_per_rail):
                k = r * self.leaves_per_rail + g
                hosts = tuple(range(self._group_start(g) + 1, self._group_start(g + 1) + 1))
                out.append(LeafPlan(f"{LEAF}{k}", k, r, g, hosts))
        return tuple(out)

    def leaf(self, name: str | int) -> LeafPlan:
        """A leaf by name or by index k."""
        for leaf in self.leaves:
            if name in (leaf.name, leaf.index) and not isinstance(name, bool):
                return leaf
        raise LabError(f"no leaf {name!r} in this lab (leaves: {', '.join(self.leaf_names)})")

    def leaves_of_rail(self, r: int) -> list[str]:
        if not 0 <= r < self.n_rails:
            raise LabError(f"no rail {r} in this lab (rails 0..{self.n_rails - 1})")
        return [leaf.name for leaf in self.leaves if leaf.rail == r]

    def leaf_ports(self, name: str) -> list[str]:
        """A leaf's interfaces: host ports in order, then its spine links."""
        leaf = self.leaf(name)
        return [self.host_rail(i, leaf.rail).leaf_port for i in leaf.hosts] + \
            [u.leaf_port for u in self.uplinks if u.leaf == leaf.name]

    @property
    def spine_names(self) -> list[str]:
        return [f"{SPINE}{s}" for s in range(self.n_spines)]

    @property
    def node_names(self) -> list[str]:
        return self.host_names + self.leaf_names + self.spine_names

    @staticmethod
    def link_ifindex(kind: str, a: int, b: int) -> int:
        """Both ends of a cable get the same ifindex, as a physical NIC has
        (ifindex == iflink): the kernel then classes carrier loss as a
        non-urgent linkwatch event, as on hardware, instead of by accident of
        creation order. Unique per node because (a, b) is unique per node."""
        base = 1000 if kind == "host" else 200_000
        return base + 256 * a + b

    # ---- hosts ---------------------------------------------------------------

    def leaf_position(self, i: int) -> int:
        """Host i's port number on its leaf (its place in its group)."""
        return i - 1 - self._group_start(self.group_of(i))

    def host_rail(self, i: int, r: int) -> HostRail:
        k = r * self.leaves_per_rail + self.group_of(i)
        j = self.leaf_position(i)
        return HostRail(
            index=r, name=f"rail{r}", port=f"{HOST}{i}-eth{r}",
            address=f"198.18.{r}.{2 * i + 1}", prefixlen=31, gateway=f"198.18.{r}.{2 * i}",
            leaf=f"{LEAF}{k}", leaf_port=f"{LEAF}{k}-eth{j}",
            mac=mac(1, i, r), leaf_mac=mac(2, k, j),
            ifindex=self.link_ifindex("host", r, i),
        )

    @cached_property
    def hosts(self) -> tuple[HostPlan, ...]:
        return tuple(HostPlan(f"{HOST}{i}", i, tuple(self.host_rail(i, r) for r in range(self.n_rails)))
                     for i in range(1, self.n_hosts + 1))

    def host(self, name: str | int) -> HostPlan:
        for plan in self.hosts:
            if name in (plan.name, plan.index):
                return plan
        raise LabError(f"no host {name!r} in this lab (hosts: {', '.join(self.host_names)})")

    def leaf_of(self, r: int) -> str:
        """Rail r's leaf, when it has one (LabError names them otherwise)."""
        leaves = self.leaves_of_rail(r)
        if len(leaves) != 1:
            raise LabError(f"rail {r} has {len(leaves)} leaves ({', '.join(leaves)}): name one")
        return leaves[0]

    @cached_property
    def uplinks(self) -> tuple[Uplink, ...]:
        out = []
        base = self.hosts_per_leaf
        for leaf in self.leaves:
            k = leaf.index
            for s in range(self.n_spines):
                out.append(Uplink(
                    leaf=leaf.name, spine=f"{SPINE}{s}", rail=leaf.rail, spine_index=s,
                    leaf_port=leaf.port(base + s), spine_port=f"{SPINE}{s}-eth{k}",
                    leaf_address=f"198.19.{s}.{2 * k + 1}", spine_address=f"198.19.{s}.{2 * k}",
                    leaf_mac=mac(2, k, base + s), spine_mac=mac(3, s, k),
                    ifindex=self.link_ifindex("uplink", s, k), leaf_index=k,
                ))
        return tuple(out)

    def _prefixes(self, leaf: LeafPlan) -> list[str]:
        """The host space behind one leaf: its rail's /24 when it is the
        rail's only leaf, else its hosts' /31s."""
        if self.leaves_per_rail == 1:
            return [f"198.18.{leaf.rail}.0/24"]
        return [f"198.18.{leaf.rail}.{2 * i}/31" for i in leaf.hosts]

    # ---- rendering -----------------------------------------------------------

    def setup(self, node: str, mechanism: str) -> NodeSetup:
        if mechanism not in MECHANISMS:
            raise LabError(f"mechanism must be one of {', '.join(MECHANISMS)}, got {mechanism!r}")
        if node.startswith(HOST):
            return self._host_setup(self.host(node), mechanism)
        if node in self.leaf_names:
            return self._leaf_setup(self.leaf(node))
        if node in self.spine_names:
            return self._spine_setup(int(node[len(SPINE):]))
        raise LabError(f"no node {node!r} in this lab")

    @staticmethod
    def _common_sysctls(ports: list[str], forwarding: bool, linkdown: bool,
                        arp_host: bool) -> dict[str, str]:
        sc = {
            "net.ipv4.ip_forward": "1" if forwarding else "0",
            # IPv4-only lab (as linkpassd is): no ND/MLD chatter in counters.
            "net.ipv6.conf.all.disable_ipv6": "1",
            "net.ipv6.conf.default.disable_ipv6": "1",
        }
        for scope in ["all", "default", *ports]:
            # Loose/no RPF: failover legitimately sends rail-r sources out of
            # rail r' (and the detour delivers rail-r addresses on rail r').
            sc[f"net.ipv4.conf.{scope}.rp_filter"] = "0"
            sc[f"net.ipv4.conf.{scope}.ignore_routes_with_linkdown"] = "1" if linkdown else "0"
            if arp_host:
                # Answer ARP only for the port's own address, and source ARP
                # from it: what multi-NIC hosts on one L2-less fabric do.
                sc[f"net.ipv4.conf.{scope}.arp_ignore"] = "1"
                sc[f"net.ipv4.conf.{scope}.arp_announce"] = "2"
        return sc

    def _host_setup(self, host: HostPlan, mechanism: str) -> NodeSetup:
        ports = [rail.port for rail in host.rails]
        setup = NodeSetup(self._common_sysctls(ports, forwarding=False,
                                               linkdown=mechanism == "kernel", arp_host=True))
        b = setup.ip_batch
        for rail in host.rails:
            b.append(f"address add {rail.interface} dev {rail.port}")
        if mechanism in ("linkpassd", "frr-bgp"):
            return setup  # connected routes only; the daemon (linkpassd, FRR) owns the rest
        for rail in host.rails:
            table = RAIL_TABLE_BASE + rail.index
            b.append(f"rule add pref {RAIL_RULE_PREF + rail.index} from {rail.address} lookup {table}")
            if mechanism == "none":
                b.append(f"route add default via {rail.gateway} dev {rail.port} table {table}")
            else:
                # Own rail first, then the others in rail order, by metric: the
                # kernel skips a linkdown route and uses the next metric. Same
                # preference as linkpassd's primary-then-backups, so a comparison
                # differs in mechanism only (multipath here would also spread
                # healthy same-rail traffic over the spines).
                order = [rail] + [x for x in host.rails if x is not rail]
                for k, via in enumerate(order):
                    b.append(f"route add default via {via.gateway} dev {via.port} "
                             f"metric {10 * (k + 1)} table {table}")
        if mechanism == "none":
            first = host.rails[0]
            b.append(f"route add {FABRIC_SPACE} via {first.gateway} dev {first.port}")
        else:
            hops = [(x.gateway, x.port) for x in host.rails]
            b.append(f"route add {FABRIC_SPACE} {_multipath(hops)}")
        return setup

    def _ecmp_sysctls(self) -> dict[str, str]:
        """Several leaves per rail: hash on the 5-tuple (module doc)."""
        return {"net.ipv4.fib_multipath_hash_policy": "1"} if self.leaves_per_rail > 1 else {}

    def _leaf_setup(self, leaf: LeafPlan) -> NodeSetup:
        r = leaf.rail
        ups = [u for u in self.uplinks if u.leaf == leaf.name]
        hosts = [self.host_rail(i, r) for i in leaf.hosts]
        ports = [h.leaf_port for h in hosts] + [u.leaf_port for u in ups]
        setup = NodeSetup({**self._common_sysctls(ports, forwarding=True, linkdown=True,
                                                  arp_host=False), **self._ecmp_sysctls()})
        b = setup.ip_batch
        for h in hosts:
            b.append(f"address add {h.gateway}/{h.prefixlen} dev {h.leaf_port}")
        for u in ups:
            b.append(f"address add {u.leaf_address}/31 dev {u.leaf_port}")
        if self.fabric == "bgp":
            return setup  # every other route is bgpd's
        to_spines = _multipath([(u.spine_address, u.leaf_port) for u in ups])
        for other in range(self.n_rails):
            if other != r:
                b.append(f"route add 198.18.{other}.0/24 {to_spines}")
        for peer in self.leaves:  # the rail's other leaves: through the spines
            if peer.rail == r and peer.name != leaf.name:
                b.extend(f"route add {prefix} {to_spines}" for prefix in self._prefixes(peer))
        if self.detour and self.n_rails > 1:
            # Outbound: own host space the main table cannot deliver (link down).
            b.append(f"route add 198.18.{r}.0/24 table default {to_spines}")
            # Inbound: detours for rail p land here; deliver over the host's
            # rail-r port, or refuse (never bounce back to the spine).
            p = (r - 1) % self.n_rails
            table = DETOUR_TABLE_BASE + p
            for u in ups:
                b.append(f"rule add pref {DETOUR_RULE_PREF} iif {u.leaf_port} "
                         f"to 198.18.{p}.0/24 lookup {table}")
            for i in leaf.hosts:
                dst, via = self.host_rail(i, p), self.host_rail(i, r)
                b.append(f"route add {dst.address}/32 via {via.address} dev {via.leaf_port} "
                         f"table {table}")
            b.append(f"route add unreachable 198.18.{p}.0/24 table {table}")
        return setup

    def _spine_setup(self, s: int) -> NodeSetup:
        ups = [u for u in self.uplinks if u.spine_index == s]
        setup = NodeSetup({**self._common_sysctls([u.spine_port for u in ups], forwarding=True,
                                                  linkdown=True, arp_host=False),
                           **self._ecmp_sysctls()})
        b = setup.ip_batch
        for u in ups:
            b.append(f"address add {u.spine_address}/31 dev {u.spine_port}")
        if self.fabric == "bgp":
            return setup  # every route is bgpd's
        for u in ups:
            b.extend(f"route add {prefix} via {u.leaf_address} dev {u.spine_port}"
                     for prefix in self._prefixes(self.leaf(u.leaf)))
        if self.detour and self.n_rails > 1:
            by_leaf = {u.leaf_index: u for u in ups}
            for u in ups:
                here = self.leaf(u.leaf)
                nxt = by_leaf[((u.rail + 1) % self.n_rails) * self.leaves_per_rail + here.group]
                table = DETOUR_TABLE_BASE + u.leaf_index
                # Only this leaf's own hosts: what else it sends up is ordinary
                # traffic to the rail's other leaves.
                for prefix in self._prefixes(here):
                    b.append(f"rule add pref {DETOUR_RULE_PREF + u.leaf_index} iif {u.spine_port} "
                             f"to {prefix} lookup {table}")
                    b.append(f"route add {prefix} via {nxt.leaf_address} "
                             f"dev {nxt.spine_port} table {table}")
        return setup

    def describe(self) -> str:
        """The addressing as a table, for humans."""
        leaves = (f", {self.leaves_per_rail} leaves per rail (hosts per leaf: "
                  f"{', '.join(str(len(x.hosts)) for x in self.leaves if x.rail == 0)})"
                  if self.leaves_per_rail > 1 else "")
        lines = [f"railopt: {self.n_hosts} hosts x {self.n_rails} rails, {self.n_spines} spine(s)"
                 f"{leaves}, "
                 + ("fabric bgp" if self.fabric == "bgp"
                    else f"detour {'on' if self.detour else 'off'}"),
                 f"{'host':<7}{'rail':<6}{'port':<13}{'address':<18}{'gateway':<15}leaf port"]
        for host in self.hosts:
            for rail in host.rails:
                lines.append(f"{host.name:<7}{rail.index:<6}{rail.port:<13}{rail.interface:<18}"
                             f"{rail.gateway:<15}{rail.leaf_port}")
        for u in self.uplinks:
            lines.append(f"{u.leaf:<7}{'up':<6}{u.leaf_port:<13}{u.leaf_address + '/31':<18}"
                         f"{u.spine_address:<15}{u.spine_port}")
        return "\n".join(lines)


# ---- linkpassd ---------------------------------------------------------------


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")


def with_section_options(text: str, section: str, opts: dict[str, object]) -> str:
    """The TOML ``text`` (a generated linkpassd config) with ``opts`` set in
    table ``[section]``: replacing keys it already has, adding the others, or
    appending the table. How the benches and lab tests turn on what
    `linkpassd_toml` leaves at its defaults (``[fence]``, echo options)."""
    if not opts:
        return text
    lines = text.splitlines()
    header = f"[{section}]"
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == header)
    except StopIteration:
        return text.rstrip("\n") + "\n" + "\n".join(
            [header] + [f"{k} = {_toml(v)}" for k, v in opts.items()]) + "\n"
    end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")),
               len(lines))
    body = [line for line in lines[start + 1:end]
            if line.split("=", 1)[0].strip() not in opts]
    body += [f"{k} = {_toml(v)}" for k, v in opts.items()]
    return "\n".join(lines[:start + 1] + body + lines[end:]) + "\n"


def linkpassd_toml(host: HostPlan, *, control_socket: str, run_dir: str,
                   timers: dict[str, float | int] | None = None,
                   log_level: str = "info", multipath: bool = True,
                   bfd: dict | None = None, probes: dict | None = None,
                   peers: dict[int, list[str]] | None = None,
                   aggregator: str | None = None, announce: dict | None = None) -> str:
    """A linkpassd config for one lab host: one rail per port, every rail
    backed up by the others in rail order, and one resilient group `fabric`.

    Destinations are HOST_SPACE (198.18.0.0/16, where every peer's rail
    address lives), not all of 198.18.0.0/15: hosts never address the
    leaf-spine links. No single prefix can leave out the host's own /31s
    (its gateways sit between peers), and linkpassd's group rule sits above
    main (below its rail rules), so unbound traffic to a host's *own*
    gateway is hashed onto the group like any peer's and may reach that leaf
    through another rail and the spine.

    What follows from that: a probe of a rail's gateway must bind to the
    port (SO_BINDTODEVICE), or a dead rail can answer through a live one.
    Nexthop creation is not affected: the kernel validates a nexthop's
    gateway with a link-scope lookup, which only connected routes satisfy
    (checked on kernel 6.18).

    Sensors: the `sim` backend, reading the files labs/simsensor.py
    writes under run_dir/sim (veth has no module and few counters), read
    five times a second so lab trials stay short.

    ``probes`` (the lab's probes option, e.g. ``{"interval_ms": 50}``): a
    ``[probes]`` section with probing enabled and those settings, and on
    each rail r ``probe_peers = peers[r]`` (the other hosts' rail-r
    addresses: the same leaf, end to end through the peer's daemon).

    ``bfd`` (the lab's bfd option, see bfd_options): a ``[bfd]`` section with
    its timers and ``bfd = true`` on every rail, a session with the rail's
    gateway (the leaf runs FRR bfdd). Without it nothing BFD is written, so
    labs without BFD keep configs that older daemons accept.

    ``aggregator`` (an address, e.g. ``unix:/tmp/lplab-x/aggregator.sock``):
    an ``[aggregator]`` section in insecure mode (labs only) with the host's
    name as its host id, and each rail's ``leaf``, so the aggregator can plan
    the probe mesh. Give no ``peers`` then: the mesh hands them out.

    ``announce`` (e.g. ``{"local_asn": 65001, "frr_run_dir": ...}``): an
    ``[announce]`` section, enabled, with those settings: the host's FRR
    announces its rail addresses to the ``bgp`` fabric as linkpassd decides."""
    bfd = bfd_options(bfd)
    out = ["# linkpassd config for lab host " + host.name + " (generated by labs.topos)",
           "[daemon]",
           f"control_socket = {_toml(control_socket)}",
           f"run_dir = {_toml(run_dir)}",
           f"state_dir = {_toml(run_dir + '/state')}",
           f"log_level = {_toml(log_level)}"]
    if timers:
        out.append("[timers]")
        out += [f"{key} = {_toml(value)}" for key, value in timers.items()]
    out += ["[sensors]", 'backend = "sim"', "counters_interval_s = 0.2", "optics_interval_s = 0.2"]
    # Flap dampening stays on, but decays in seconds rather than minutes, so a
    # lab reused across trials recovers between them.
    out += ["[health]", "flap_half_life_s = 2.0"]
    if bfd:
        out += ["[bfd]", f"interval_ms = {_toml(bfd['interval_ms'])}",
                f"detect_mult = {_toml(bfd['detect_mult'])}"]
    if aggregator is not None:
        out += ["[aggregator]", f"address = {_toml(aggregator)}", f"host_id = {_toml(host.name)}",
                "insecure = true"]
    if announce is not None:
        out += ["[announce]", "enabled = true"]
        out += [f"{key} = {_toml(value)}" for key, value in announce.items()]
    if probes is not None:
        out += ["[probes]", "enabled = true"]
        # Every lab host's rail addresses lie in HOST_SPACE: answer all of them.
        probes = {"fabric_prefixes": [HOST_SPACE], **probes}
        out += [f"{key} = {_toml(value)}" for key, value in probes.items()]
    names = [rail.name for rail in host.rails]
    for rail in host.rails:
        out += ["[[rail]]",
                f"name = {_toml(rail.name)}",
                f"port = {_toml(rail.port)}",
                f"address = {_toml(rail.interface)}",
                f"gateway = {_toml(rail.gateway)}",
                f"backups = {_toml([n for n in names if n != rail.name])}",
                f"destinations = {_toml([HOST_SPACE])}"]
        if aggregator is not None:
            out.append(f"leaf = {_toml(rail.leaf)}")
        if bfd:
            out.append("bfd = true")
        if probes is not None and (peers or {}).get(rail.index):
            out.append(f"probe_peers = {_toml(peers[rail.index])}")
    if multipath:
        out += ["[[multipath]]",
                'name = "fabric"',
                f"destination = {_toml(HOST_SPACE)}",
                f"rails = {_toml(names)}"]
    return "\n".join(out) + "\n"
