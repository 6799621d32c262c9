"""The probe mesh: which peers each host's echo prober watches, per rail.

Why a planner: typing echo peers by hand for 2,000 hosts x 8 rails is not
possible, and hand-typed peers cluster (everyone probes the first hosts of
the list), so one leaf's uplinks are watched by many and another's by none.
Pingmesh (Guo et al., SIGCOMM 2015) showed that a server-side plan handed to
every agent covers a fabric with a small, bounded number of probes per host.

Rules (docs in i12 design; all pure, no clock, no randomness):

- Per rail, every host probes `peers_per_rail` (k) peers of the same rail
  under *other* leaves, so the probe crosses the leaf's uplinks, the part a
  host cannot see from its own link state. A rail with a single leaf probes
  within it. Hosts with no leaf each count as a leaf of their own. When the
  other leaves cannot take more probes (their hosts are at the in-degree
  bound, e.g. a 100-host leaf next to a 2-host one), the rest go to the same
  leaf: a same-leaf probe still watches the host's own cable.
- Base assignment: consistent hashing with bounded loads (Mirrokni, Thorup,
  Zadimoghaddam, SODA 2018). Hosts sit on a hash ring per rail (8 virtual
  points each, so the load is even and the bound is rarely hit); a host's i-th
  probe starts at a point hashed from (rail, host, i) and takes the first host
  clockwise that is eligible (other leaf, not itself or a peer it already has,
  in-degree below 2k). A join or leave moves only the probes whose walk
  crossed that host, plus a short cascade where the bound was reached, so the
  daemons keep most probers running across a re-plan.
- Coverage pass: every ordered pair of named leaves (A, B) of the rail gets at
  least one probe from a host of A to a host of B, as long as A's hosts have
  room below `max_peers_per_rail` and B's hosts below the coverage in-degree
  bound. The prober and target for an uncovered pair are chosen by rendezvous
  hashing over the pair, so they too move little when hosts come and go.
- Deterministic: the result depends only on the set of members, never on
  their order (input is sorted; hashes are blake2b, not Python's salted hash).
"""

from __future__ import annotations

import bisect
import hashlib
import ipaddress
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from linkpassd._proto.linkpass.v1 import fleet_pb2

_MASK = (1 << 64) - 1
VIRTUAL_POINTS = 8  # ring points per host (see _Ring)


@dataclass(frozen=True)
class Member:
    """One host's port on one rail, as the mesh sees it."""

    host_id: str
    rail: str  # rail name; rails match across hosts by name
    address: str  # the port's own address without prefix, e.g. "198.18.0.1"
    leaf: str = ""  # "" = unknown: the host is a leaf of its own


def members_from_inventory(host_id: str, inventory: fleet_pb2.Inventory) -> list[Member]:
    """The mesh members of one host's inventory. A rail without a usable
    address (empty or unparseable: the host sent something odd) is left out
    rather than raising: one host's bad inventory must not stop the plan."""
    out = []
    for rail in inventory.rails:
        if not rail.rail:
            continue
        try:
            address = str(ipaddress.ip_interface(rail.address.strip()).ip)
        except ValueError:
            continue
        out.append(Member(host_id=host_id, rail=rail.rail, address=address, leaf=rail.leaf))
    return out


def probe_peers(host_plan: Mapping[str, Sequence[str]], generation: int,
                probed_by: Mapping[str, Sequence[str]] | None = None) -> fleet_pb2.ProbePeers:
    """The ProbePeers message for one host's part of a plan (rails by name),
    with who probes it on each rail (see `probers`)."""
    probed_by = probed_by or {}
    return fleet_pb2.ProbePeers(
        generation=generation,
        rails=[fleet_pb2.RailPeers(rail=rail, peers=list(host_plan[rail]),
                                   probed_by=list(probed_by.get(rail, ())))
               for rail in sorted(host_plan)],
    )


def probers(plan_: Mapping[str, Mapping[str, Sequence[str]]],
            members: Iterable[Member]) -> dict[str, dict[str, tuple[str, ...]]]:
    """host_id -> rail -> the addresses that probe that host on that rail
    (sorted): the plan turned around. Each host's responder must answer
    these, and the mesh is not symmetric (A probing B does not make B probe A)."""
    host_at = {(m.rail, m.address): m.host_id for m in members}
    address_of = {(m.host_id, m.rail): m.address for m in members}
    found: dict[str, dict[str, set[str]]] = {}
    for host, rails in plan_.items():
        for rail, peers in rails.items():
            source = address_of.get((host, rail))
            if source is None:
                continue
            for peer in peers:
                target = host_at.get((rail, peer))
                if target is not None:
                    found.setdefault(target, {}).setdefault(rail, set()).add(source)
    return {host: {rail: tuple(sorted(srcs)) for rail, srcs in rails.items()}
            for host, rails in found.items()}


Plan = dict[str, dict[str, tuple[str, ...]]]


def plan(members: Iterable[Member], *, peers_per_rail: int, max_peers_per_rail: int) -> Plan:
    """host_id -> rail -> peer addresses (sorted). Every host with a member
    appears with each of its rails (an empty tuple when the rail has nobody
    else). Bounds: at most `max_peers_per_rail` peers per host per rail; a host
    is the target of at most 2k base probes plus (max - k) coverage probes."""
    if peers_per_rail < 0:
        raise ValueError(f"peers_per_rail must be >= 0, not {peers_per_rail}")
    if max_peers_per_rail < peers_per_rail:
        raise ValueError(f"max_peers_per_rail ({max_peers_per_rail}) must be >= peers_per_rail ({peers_per_rail})")
    by_rail: dict[str, dict[str, Member]] = defaultdict(dict)
    for m in members:
        held = by_rail[m.rail].get(m.host_id)
        if held is None or m.address < held.address:  # a duplicate: the smallest address, whatever the order
            by_rail[m.rail][m.host_id] = m
    result: Plan = defaultdict(dict)
    for rail in sorted(by_rail):
        rail_members = [by_rail[rail][h] for h in sorted(by_rail[rail])]
        for host_id, peers in _plan_rail(rail, rail_members, peers_per_rail, max_peers_per_rail).items():
            result[host_id][rail] = peers
    return dict(result)


def in_degree_bound(peers_per_rail: int, max_peers_per_rail: int) -> int:
    """The most probers one host has on one rail: 2k from the base
    assignment, plus the room the coverage pass may use."""
    return 2 * peers_per_rail + (max_peers_per_rail - peers_per_rail)


# --------------------------------------------------------------------------
# one rail
# --------------------------------------------------------------------------


def _hash(*parts: str) -> int:
    digest = hashlib.blake2b("\0".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _mix(a: int, b: int) -> int:
    """A 64-bit mix of two hashes (splitmix64's finaliser): cheap enough to
    rank every host of a leaf, good enough to spread the picks."""
    z = (a ^ (b * 0x9E3779B97F4A7C15)) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


class _Ring:
    """Hosts (indices) at their virtual points on a hash ring, for clockwise
    walks. Several points per host even out the arcs between points, so
    each host is reached by about as many walks as any other (with one
    point per host, a host after a long arc collects many probes, reaches
    its in-degree bound and deflects the rest: churn on every re-plan)."""

    def __init__(self, points: list[tuple[int, ...]], hosts: Iterable[int]) -> None:
        ring = sorted((p, i) for i in hosts for p in points[i])
        self.hosts = [i for _, i in ring]
        self.points = [p for p, _ in ring]

    def walk(self, point: int) -> Iterable[int]:
        """Every host, clockwise from `point` (a host once per virtual point)."""
        n = len(self.hosts)
        start = bisect.bisect_left(self.points, point)
        for step in range(n):
            yield self.hosts[(start + step) % n]


def _plan_rail(rail: str, members: list[Member], k: int, max_peers: int) -> dict[str, tuple[str, ...]]:
    n = len(members)
    # Leaf keys: a named leaf, or the host itself when it has none.
    leaf_of = [("leaf", m.leaf) if m.leaf else ("host", m.host_id) for m in members]
    leaves: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, leaf in enumerate(leaf_of):
        leaves[leaf].append(i)
    positions = [_hash("ring", rail, m.host_id) for m in members]  # also the order hosts choose in
    points = [tuple(_mix(positions[i], v) for v in range(VIRTUAL_POINTS)) for i in range(n)]
    seeds = [_hash("probe", rail, m.host_id) for m in members]
    chosen: list[list[int]] = [[] for _ in range(n)]
    in_deg = [0] * n
    base_cap = 2 * k

    full_ring = _Ring(points, range(n))
    # A big leaf walks a ring without its own hosts, so its probes do not step
    # over hundreds of same-leaf hosts (or lap the ring when the other leaves
    # are full). Small leaves use the full ring: their runs on it are short.
    big = max(8, n // 16)
    own_ring_excluded = {leaf: _Ring(points, (i for i in range(n) if leaf_of[i] != leaf))
                         for leaf, hosts in leaves.items() if len(hosts) > big}
    single_leaf = len(leaves) == 1

    def take(src: int, candidates: Iterable[int], same_leaf: bool) -> bool:
        for j in candidates:
            if j == src or j in chosen[src] or in_deg[j] >= base_cap:
                continue
            if (leaf_of[j] == leaf_of[src]) != same_leaf:
                continue
            if members[j].address == members[src].address:
                continue
            chosen[src].append(j)
            in_deg[j] += 1
            return True
        return False

    for src in sorted(range(n), key=lambda i: positions[i]):
        other_ring = own_ring_excluded.get(leaf_of[src], full_ring)
        for probe in range(k):
            point = _mix(seeds[src], probe + 1)
            if not single_leaf and take(src, other_ring.walk(point), same_leaf=False):
                continue
            # No other leaf has room (or there is none): watch the own cable at least.
            take(src, full_ring.walk(point), same_leaf=True)

    if k > 0 and max_peers > k:
        _cover_leaf_pairs(rail, members, leaf_of, leaves, seeds, chosen, in_deg,
                          max_peers, in_degree_bound(k, max_peers))

    return {members[i].host_id: tuple(sorted({members[j].address for j in chosen[i]})) for i in range(n)}


def _cover_leaf_pairs(rail: str, members: list[Member], leaf_of: list[tuple[str, str]],
                      leaves: dict[tuple[str, str], list[int]], seeds: list[int],
                      chosen: list[list[int]], in_deg: list[int], max_peers: int, in_cap: int) -> None:
    """Add a probe for each uncovered ordered pair of named leaves, within the
    bounds. Hosts without a leaf take no part: a 'pair' of two hosts is what
    the base assignment already spreads, and covering all n^2 of them is
    neither possible within the bound nor useful."""
    named = sorted(leaf for leaf in leaves if leaf[0] == "leaf")
    if len(named) < 2:
        return
    covered = {(leaf_of[i], leaf_of[j]) for i in range(len(members)) for j in chosen[i]}
    spare = {leaf: sum(max_peers - len(chosen[i]) for i in leaves[leaf]) for leaf in named}
    # Target leaves on a ring of their own; each source leaf starts its round
    # at its own point on it, so when room runs out it is not always the same
    # target leaves that go uncovered, and a leaf joining or leaving shifts no
    # other leaf's round (a rotation by index would shift all of them).
    leaf_points = {leaf: _hash("cover-ring", rail, leaf[1]) for leaf in named}
    ring = sorted(named, key=lambda leaf: leaf_points[leaf])
    ring_points = [leaf_points[leaf] for leaf in ring]
    for a in named:
        start = bisect.bisect_left(ring_points, _hash("cover-start", rail, a[1]))
        for step in range(len(ring)):
            if spare[a] <= 0:
                break
            b = ring[(start + step) % len(ring)]
            if b == a or (a, b) in covered:
                continue
            pair_seed = _hash("cover", rail, a[1], b[1])
            sources = [i for i in leaves[a] if len(chosen[i]) < max_peers]
            targets = [j for j in leaves[b] if in_deg[j] < in_cap]
            if not sources or not targets:
                continue
            for src in sorted(sources, key=lambda i: _mix(pair_seed, seeds[i]), reverse=True):
                fresh = [j for j in targets if j not in chosen[src] and members[j].address != members[src].address]
                if fresh:
                    dst = max(fresh, key=lambda j: _mix(pair_seed ^ 1, seeds[j]))
                    chosen[src].append(dst)
                    in_deg[dst] += 1
                    spare[a] -= 1
                    covered.add((a, b))
                    break
