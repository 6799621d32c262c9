"""Forwarding-plane blackholes that fleet validation must localise (issue 13).

Both drop every frame but LLDP, both ways, on one leaf port, with the
nftables machinery of nft.NftFault (armed by interface group, counted,
removed on clear). LLDP passes because these model a switch whose
forwarding plane eats traffic while its control plane (which answers LLDP)
is fine: the cable and the neighbour check out, only probes see the fault.
That keeps each finding separate: SilentBlackhole drops LLDP too, as a
dead optic or cut fibre would.

- ``LeafPortBlackhole(lab, host, rail)``: the leaf's port facing that host
  port. Every probe to or from that host port dies; nothing else does.
- ``SpineLinkBlackhole(lab, leaf, spine)``: the leaf's port toward that spine.
  With one leaf per rail, what crosses a spine is traffic between rails (a
  host's rail-a address to another's rail-b address) and the detour; with
  several leaves per rail (``railopt(..., leaves_per_rail=L)``) also the
  rail's own traffic between leaves. With several spines only the flows
  hashed onto that link die (a multipath route keeps using a link whose
  carrier is up); multi-leaf labs hash on the 5-tuple, so a pair's flows
  from different source ports die or live independently.
"""

from __future__ import annotations

from typing import Any

from labs.faults.nft import HOOKS, NftFault
from labs.topos.lab import Lab
from labs.topos.plan import SPINE, LabError, Uplink

LLDP_PASSES = "ether type != 0x88cc"


class LeafPortBlackhole(NftFault):
    """Every frame but LLDP dropped both ways at the leaf's host-facing port."""

    kind = "leaf-port-blackhole"

    def _match(self) -> str:
        return LLDP_PASSES

    @property
    def description(self) -> str:
        return (f"{self.kind} on {self.rail.leaf} {self.rail.leaf_port} "
                f"(facing {self.host.name} {self.rail.port})")


class SpineLinkBlackhole(NftFault):
    """Every frame but LLDP dropped both ways on one leaf-spine link, at
    the leaf's end. ``leaf``/``spine``: node names or rail/spine numbers."""

    kind = "spine-link-blackhole"

    def __init__(self, lab: Lab, leaf: str | int, spine: str | int):
        self.uplink = _uplink(lab, leaf, spine)
        self.host = None  # a fabric link: no host port
        self.rail = None
        self._init_state(lab)
        self._init_rules(self.uplink.leaf, self.uplink.leaf_port, tuple(HOOKS))

    def _match(self) -> str:
        return LLDP_PASSES

    @property
    def description(self) -> str:
        u = self.uplink
        return f"{self.kind} on {u.leaf} {u.leaf_port} <-> {u.spine} {u.spine_port}"

    def record(self) -> dict[str, Any]:
        u = self.uplink
        return {"fault": self.kind, "description": self.description, "leaf": u.leaf,
                "leaf_port": u.leaf_port, "spine": u.spine, "spine_port": u.spine_port,
                "rail": u.rail, **self.stamps()}


class SpineLinkLoss(NftFault):
    """Frames dropped with probability ``percent``/100 on one leaf-spine
    link, at the leaf's end, in one direction or both: ``leaf_to_spine``
    (what the leaf sends up: egress) and ``spine_to_leaf`` (ingress). LLDP
    included, as a lossy optic would. Only flows ECMP hashes onto the link
    see it."""

    kind = "spine-link-loss"
    hooks = {"leaf_to_spine": "egress", "spine_to_leaf": "ingress"}

    def __init__(self, lab: Lab, leaf: str | int, spine: str | int, percent: int,
                 directions: tuple[str, ...] = ("leaf_to_spine", "spine_to_leaf")):
        from labs.faults.nft import _percent
        self.percent = _percent(percent)
        self.uplink = _uplink(lab, leaf, spine)
        self.host = None  # a fabric link: no host port
        self.rail = None
        self._init_state(lab)
        self._init_rules(self.uplink.leaf, self.uplink.leaf_port, directions)

    def _match(self) -> str:
        return f"numgen random mod 100 < {self.percent}"

    @property
    def description(self) -> str:
        u = self.uplink
        ways = "" if len(self.directions) == 2 else f" {self.directions[0].replace('_', ' ')}"
        return (f"{self.kind} on {u.leaf} {u.leaf_port} <-> {u.spine} {u.spine_port}: "
                f"{self.percent}% loss{ways}")

    def record(self) -> dict[str, Any]:
        u = self.uplink
        return {"fault": self.kind, "description": self.description, "leaf": u.leaf,
                "leaf_port": u.leaf_port, "spine": u.spine, "spine_port": u.spine_port,
                "rail": u.rail, "percent": self.percent, "directions": list(self.directions),
                **self.stamps()}


def _uplink(lab: Lab, leaf: str | int, spine: str | int) -> Uplink:
    plan = lab.plan
    leaf_name = plan.leaf_of(leaf) if isinstance(leaf, int) else leaf
    spine_name = f"{SPINE}{spine}" if isinstance(spine, int) else spine
    for up in plan.uplinks:
        if (up.leaf, up.spine) == (leaf_name, spine_name):
            return up
    raise LabError(f"no link {leaf_name!r} <-> {spine_name!r} in this lab (leaves: "
                   f"{', '.join(plan.leaf_names)}; spines: {', '.join(plan.spine_names)})")
