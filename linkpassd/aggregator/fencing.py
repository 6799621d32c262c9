"""Fence grants (docs/fencing.md): at most `[fence] leaf_cap` ports behind
one leaf fenced at once across the hosts, so that a leaf failure (every
host's port on it failing together) fences no more than the cap.

What a host says of its ports (its PortReport's phases, set by core.fence's
overlay): FENCE_FENCED or FENCE_TESTING while it holds a port fenced,
FENCE_ASKING while a port would be fenced but for its leaf's grant. Per leaf
(the inventory's `leaf` of each rail), the ports held count against the
cap first; the askers are granted in a stable order (host, port) up to what
is left, those granted before first: a grant is never moved from a port that
still asks to another (the host may have fenced on it already, before its
report says so). A host is told its granted ports (held ones included, so a fence
stays granted while it lasts) whenever they change, and when it connects.

A port whose rail names no leaf is never granted: the aggregator cannot
count it against any cap (set `leaf` on each rail).

A host that disconnects keeps its last report here: a port it held fenced
still counts against its leaf until the host says otherwise, since its
daemon may still hold it (this errs on the side of fewer fences). With
replicas sharing a store, each replica counts the hosts on its own streams
(docs/fencing.md says what that means for the cap).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import structlog

from linkpassd._proto.linkpass.v1 import fleet_pb2 as pb
from linkpassd.aggregator.session import HostSession
from linkpassd.core.fence import ASKING_PHASE, HOLDING_PHASES

log = structlog.get_logger("linkpass.aggregator")


@dataclass(frozen=True)
class PortSeen:
    host: str
    port: str
    leaf: str
    phase: str


def ports_of(host: str, inventory: pb.Inventory | None, report: pb.PortReport | None
             ) -> list[PortSeen]:
    if inventory is None or report is None:
        return []
    leaf_of = {r.port: r.leaf for r in inventory.rails if r.port}
    return [PortSeen(host, p.port, leaf_of.get(p.port, ""), p.phase) for p in report.ports
            if p.phase in HOLDING_PHASES or p.phase == ASKING_PHASE]


def grants(ports: Iterable[PortSeen], cap: int,
           before: frozenset[tuple[str, str]] = frozenset()) -> dict[str, frozenset[str]]:
    """Host -> the ports it may hold fenced (pure). `before`: the (host,
    port) pairs granted last time, which keep their grant while they ask."""
    by_leaf: dict[str, list[PortSeen]] = {}
    for p in ports:
        if p.leaf:
            by_leaf.setdefault(p.leaf, []).append(p)
    out: dict[str, set[str]] = {}
    for leaf_ports in by_leaf.values():
        held = [p for p in leaf_ports if p.phase in HOLDING_PHASES]
        asking = sorted((p for p in leaf_ports if p.phase == ASKING_PHASE),
                        key=lambda p: ((p.host, p.port) not in before, p.host, p.port))
        for p in held + asking[:max(0, cap - len(held))]:
            out.setdefault(p.host, set()).add(p.port)
    return {h: frozenset(ps) for h, ps in out.items()}


class FenceGrants:
    """The grants between reports, and what each host was told."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.seen: dict[str, list[PortSeen]] = {}  # host -> its fence-relevant ports, last report
        self.told: dict[str, frozenset[str]] = {}
        self.granted: frozenset[tuple[str, str]] = frozenset()  # (host, port), last computed
        # host -> its newest inventory as read off the stream (the session's
        # is set only once stored, after a report read right behind it)
        self.inventories: dict[str, pb.Inventory] = {}

    def inventory(self, host: str, inventory: pb.Inventory) -> None:
        self.inventories[host] = inventory

    def report(self, session: HostSession, report: pb.PortReport) -> None:
        inventory = self.inventories.get(session.host_id) or session.inventory
        self.seen[session.host_id] = ports_of(session.host_id, inventory, report)

    def update(self, sessions: Mapping[str, HostSession]) -> None:
        """Recompute and tell every open session whose grants changed."""
        now = grants((p for ports in self.seen.values() for p in ports), self.cap, self.granted)
        self.granted = frozenset((h, p) for h, ports in now.items() for p in ports)
        for host, session in sessions.items():
            mine = now.get(host, frozenset())
            if not session.open or self.told.get(host) == mine:
                continue
            session.send(pb.ConnectResponse(fence=pb.FenceGrants(ports=sorted(mine),
                                                                 leaf_cap=self.cap)))
            if mine != self.told.get(host, frozenset()):
                log.info("fence_granted", host=host, ports=sorted(mine) or "none")
            self.told[host] = mine

    def joined(self, host: str) -> None:
        """A new stream: tell it its grants afresh (the agent forgot them)."""
        self.told.pop(host, None)
