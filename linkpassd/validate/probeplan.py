"""Which host pairs probe each other on each rail during a validation.

Why this shape (issue 13): a validation must prove every cable and every
path, once, in minutes, so its plan differs from the steady probe mesh
(linkpassd/aggregator/mesh.py, a few peers per host for ever):

- Under a leaf, *every* pair of hosts probes: traffic between two hosts of a
  leaf crosses only their two cables and the leaf, so a pair that fails while
  both hosts' other pairs work names a cable or port; with all pairs, a host
  port whose every pair fails stands out against its neighbours. One
  direction per unordered pair is enough (an echo is a round trip); who
  sends alternates around a circle (a round-robin tournament orientation),
  so every host sends to about half of its leaf, (n-1)/2 rounded.
- Across leaves, a sample: every unordered pair of leaves of the rail gets
  at least `cross_per_leaf_pair` host pairs (so every leaf-to-leaf path
  through the spines is tried, and with ECMP more than one flow of it), and
  every host at least `cross_per_host` cross-leaf pairs (so a leaf port that
  drops only what goes up to the spines still shows on each host). Hosts of
  a leaf are taken round-robin across its leaf pairs, so the load is even;
  the sender of a cross pair is whichever end has sent less so far (on a
  tie, the one that has answered more), so sending and answering are both
  spread.
- Deterministic: members are sorted first, no hash seeds, no randomness; the
  same members give the same plan whatever their order.

Size (tested): sum over leaves of n(n-1)/2, plus per rail, per unordered
leaf pair (A, B) of L leaves, min(|A||B|, max(m, ceil(c max(|A|,|B|) / (L-1)))).
At 2,048 hosts x 8 rails with 32 hosts per leaf that is ~286 k probes, about
17 targets per host per rail (labs/bench/validate_model.py).

Hosts whose leaf is unknown ("") are each a leaf of their own.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from linkpassd._proto.linkpass.v1 import fleet_pb2

CROSS_PER_LEAF_PAIR = 2
CROSS_PER_HOST = 2


@dataclass(frozen=True)
class Member:
    """One host's port on one rail, as the probe plan sees it."""

    host: str
    rail: str
    address: str = ""  # the port's rail address (peers probe it); "" when not known yet
    leaf: str = ""  # the switch the plan puts it under; "" = a leaf of its own


@dataclass(frozen=True)
class Probe:
    """One unordered host pair on a rail, and which end sends."""

    rail: str
    sender: str
    receiver: str
    sender_leaf: str
    receiver_leaf: str

    @property
    def cross_leaf(self) -> bool:
        return self.sender_leaf != self.receiver_leaf


@dataclass(frozen=True)
class Target:
    """Whom a host probes (or who probes it), like fleet_pb2.ProbeTarget."""

    rail: str
    peer: str  # the peer's rail address ("" when the members carried none)
    peer_host: str

    def to_proto(self) -> fleet_pb2.ProbeTarget:
        return fleet_pb2.ProbeTarget(rail=self.rail, peer=self.peer, peer_host=self.peer_host)


@dataclass(frozen=True)
class ProbePlan:
    probes: tuple[Probe, ...]
    members: tuple[Member, ...]

    @classmethod
    def build(cls, members: Iterable[Member], *, cross_per_leaf_pair: int = CROSS_PER_LEAF_PAIR,
              cross_per_host: int = CROSS_PER_HOST) -> ProbePlan:
        if cross_per_leaf_pair < 1:
            raise ValueError(f"cross_per_leaf_pair must be >= 1 (every leaf pair covered), not {cross_per_leaf_pair}")
        if cross_per_host < 0:
            raise ValueError(f"cross_per_host must be >= 0, not {cross_per_host}")
        by_rail: dict[str, dict[str, Member]] = defaultdict(dict)
        for m in members:
            held = by_rail[m.rail].get(m.host)
            if held is None or (m.address, m.leaf) < (held.address, held.leaf):  # a duplicate: order-independent pick
                by_rail[m.rail][m.host] = m
        probes: list[Probe] = []
        kept: list[Member] = []
        for rail in sorted(by_rail):
            rail_members = [by_rail[rail][h] for h in sorted(by_rail[rail])]
            kept.extend(rail_members)
            probes.extend(_plan_rail(rail, rail_members, cross_per_leaf_pair, cross_per_host))
        return cls(tuple(probes), tuple(kept))

    @classmethod
    def from_plan(cls, plan: object, addresses: Mapping[tuple[str, str], str] | None = None,
                  **options: int) -> ProbePlan:
        """From a validate.plan.CablingPlan (leaf = the planned switch);
        `addresses`: (host, rail) -> rail address, when known."""
        addresses = addresses or {}
        return cls.build((Member(host=p.host, rail=p.rail, address=addresses.get((p.host, p.rail), ""), leaf=p.switch)
                          for p in plan.ports), **options)  # type: ignore[attr-defined]

    @property
    def size(self) -> int:
        return len(self.probes)

    def targets_for(self, host: str) -> list[Target]:
        """Whom `host` probes, by rail then peer host."""
        return [Target(p.rail, self._address[(p.receiver, p.rail)], p.receiver) for p in self._sent_by.get(host, ())]

    def probers_of(self, host: str) -> list[Target]:
        """Who probes `host` (its echo responder must answer them)."""
        return [Target(p.rail, self._address[(p.sender, p.rail)], p.sender) for p in self._received_by.get(host, ())]

    def counts(self) -> dict[str, dict[str, int]]:
        """rail -> {"intra": n, "cross": n}."""
        out: dict[str, dict[str, int]] = {}
        for p in self.probes:
            row = out.setdefault(p.rail, {"intra": 0, "cross": 0})
            row["cross" if p.cross_leaf else "intra"] += 1
        return out

    def degrees(self) -> dict[tuple[str, str], tuple[int, int]]:
        """(host, rail) -> (probes it sends, probes it answers)."""
        sent: dict[tuple[str, str], int] = defaultdict(int)
        answered: dict[tuple[str, str], int] = defaultdict(int)
        for p in self.probes:
            sent[(p.sender, p.rail)] += 1
            answered[(p.receiver, p.rail)] += 1
        return {(m.host, m.rail): (sent[(m.host, m.rail)], answered[(m.host, m.rail)]) for m in self.members}

    @cached_property
    def _sent_by(self) -> dict[str, list[Probe]]:
        out: dict[str, list[Probe]] = defaultdict(list)
        for p in sorted(self.probes, key=lambda p: (p.rail, p.receiver)):
            out[p.sender].append(p)
        return dict(out)

    @cached_property
    def _received_by(self) -> dict[str, list[Probe]]:
        out: dict[str, list[Probe]] = defaultdict(list)
        for p in sorted(self.probes, key=lambda p: (p.rail, p.sender)):
            out[p.receiver].append(p)
        return dict(out)

    @cached_property
    def _address(self) -> dict[tuple[str, str], str]:
        return {(m.host, m.rail): m.address for m in self.members}


def expected_size(leaf_sizes_per_rail: Mapping[str, Sequence[int]], *,
                  cross_per_leaf_pair: int = CROSS_PER_LEAF_PAIR, cross_per_host: int = CROSS_PER_HOST) -> int:
    """The plan's size from the leaf sizes alone (the formula of the module doc)."""
    total = 0
    for sizes in leaf_sizes_per_rail.values():
        total += sum(n * (n - 1) // 2 for n in sizes)
        leaves = len(sizes)
        for i in range(leaves):
            for j in range(i + 1, leaves):
                total += _cross_count(sizes[i], sizes[j], leaves, cross_per_leaf_pair, cross_per_host)
    return total


# --------------------------------------------------------------------------


def _cross_count(p: int, q: int, leaves: int, per_leaf_pair: int, per_host: int) -> int:
    """How many host pairs a leaf pair gets: at least per_leaf_pair, and
    enough that over its L-1 leaf pairs each host of either leaf gets
    per_host; never more than every pair."""
    need = math.ceil(per_host * max(p, q) / (leaves - 1)) if leaves > 1 else 0
    return min(p * q, max(per_leaf_pair, need))


def _plan_rail(rail: str, members: list[Member], per_leaf_pair: int, per_host: int) -> list[Probe]:
    leaves: dict[str, list[str]] = defaultdict(list)
    leaf_of: dict[str, str] = {}
    for m in members:  # sorted by host
        leaf = m.leaf or f"(host {m.host})"
        leaves[leaf].append(m.host)
        leaf_of[m.host] = leaf
    sent: dict[str, int] = defaultdict(int)
    answered: dict[str, int] = defaultdict(int)
    probes: list[Probe] = []

    def add(sender: str, receiver: str) -> None:
        sent[sender] += 1
        answered[receiver] += 1
        probes.append(Probe(rail, sender, receiver, leaf_of[sender], leaf_of[receiver]))

    names = sorted(leaves)
    for leaf in names:
        hosts = leaves[leaf]
        n = len(hosts)
        for i in range(n):
            for j in range(i + 1, n):
                # Circle orientation: i sends to the next (n-1)//2 around the
                # circle; with n even, the opposite host goes to the lower index.
                d = j - i
                if 2 * d <= n:
                    add(hosts[i], hosts[j])
                else:
                    add(hosts[j], hosts[i])
    cursor: dict[str, int] = defaultdict(int)
    for a_i, a in enumerate(names):
        for b in names[a_i + 1:]:
            ha, hb = leaves[a], leaves[b]
            p, q = len(ha), len(hb)
            k = _cross_count(p, q, len(names), per_leaf_pair, per_host)
            period = math.lcm(p, q)
            for i in range(k):
                # Diagonals of the p x q grid: (i mod p, i + i//lcm mod q) visits
                # every cell once before repeating, so the k pairs are distinct.
                x = ha[(cursor[a] + i) % p]
                y = hb[(cursor[b] + i + i // period) % q]
                # The end that has sent less sends; on a tie, the one that has
                # answered more (the prober and the echo responder are different
                # threads of the daemon: neither should carry a host's whole load).
                if (sent[x], -answered[x], i % 2) <= (sent[y], -answered[y], 0):
                    add(x, y)
                else:
                    add(y, x)
            cursor[a] += k
            cursor[b] += k
    return probes
