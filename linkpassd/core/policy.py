"""Policy: port verdicts + config -> the routing the host should have.

Every rail gets a source table (`from <rail address> lookup <table>`, and
before it the same for RoCEv2, UDP dport 4791) whose routes point at the rail's own nexthop
while the rail is UP, and at the first healthy backup rail otherwise.
Multipath destinations get a resilient nexthop group over the healthy rails,
so that losing a path remaps only that path's flows.

With echo probing enabled, every rail also gets a probe table that always
routes through the rail's own nexthop (while it has carrier), and two rules
ahead of all others send our probes (UDP to the echo port) and our
responder's replies (UDP from it) from the rail address there. Without them a
rail that failed over would probe through its backup, and never see its own
path recover.

Invariants (tested):
  * a path is chosen from UP rails first, then DEGRADED ones, then rails that
    merely have carrier (recovering); among drained ports, the latest drain
    first (a drain never moves traffic back onto a port drained before it);
    a table or group is left without a path
    only when no candidate port has carrier at all;
  * a group keeps at least `min_paths` members while that many ports have
    carrier (the capacity floor);
  * identical inputs give identical output (no clocks, no randomness).

Every nexthop id, rule priority and auto table comes from the allocation
(core.alloc), by name, never from a position in the config: adding a rail
changes nothing that exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from linkpassd.core import alloc
from linkpassd.core.alloc import Allocation
from linkpassd.core.model import (
    Config,
    GroupStatus,
    KernelState,
    Nexthop,
    NexthopGroup,
    PortState,
    RailConfig,
    RailStatus,
    Route,
    Rule,
    Verdict,
)

ROCEV2_UDP_PORT = 4791
IPPROTO_UDP = 17

_RANK = {Verdict.UP: 0, Verdict.DEGRADED: 1, Verdict.DOWN: 2}


@dataclass(frozen=True)
class Decision:
    desired: KernelState
    rails: tuple[RailStatus, ...]
    groups: tuple[GroupStatus, ...]


def _usable(state: PortState | None) -> bool:
    """The kernel accepts a nexthop on the port only while it has carrier."""
    return state is not None and state.carrier


def ranked(candidates: list[RailConfig], ports: Mapping[str, PortState]) -> list[RailConfig]:
    """Rails that can carry a path, best first: verdict, then configured
    order; among drained ports of one verdict, the latest drain first (see
    _latest_drain_first)."""
    order = {rail.name: i for i, rail in enumerate(candidates)}
    usable = [r for r in candidates if _usable(ports.get(r.port))]
    best = sorted(usable, key=lambda r: (_RANK[ports[r.port].verdict], order[r.name]))
    return _latest_drain_first(best, ports, order)


def _latest_drain_first(best: list[RailConfig], ports: Mapping[str, PortState],
                        order: Mapping[str, int]) -> list[RailConfig]:
    """Drained ports swap places among themselves (within one verdict) so
    the one drained last comes first; every other rail keeps its place.

    A drain moved traffic off its port onto the next one; a later drain of
    that next one, with no healthy port left, must leave the traffic where
    it is, not move it back onto the port drained first (configured order
    alone would: both are DEGRADED, and the primary comes first)."""
    out = list(best)
    for rank in {_RANK[ports[r.port].verdict] for r in best}:
        drained_at = {i: drain.at for i, r in enumerate(out)
                      if (drain := ports[r.port].drain) is not None and _RANK[ports[r.port].verdict] == rank}
        places = list(drained_at)
        latest = [out[i] for i in sorted(places, key=lambda i: (-drained_at[i], order[out[i].name]))]
        for i, rail in zip(places, latest):
            out[i] = rail
    return out


def active_rail(config: Config, rail: RailConfig,
                ports: Mapping[str, PortState]) -> RailConfig | None:
    candidates = [rail] + [config.rail(name) for name in rail.backups]
    best = ranked(candidates, ports)
    return best[0] if best else None


def group_members(config: Config, rails: list[RailConfig], min_paths: int,
                  ports: Mapping[str, PortState]) -> list[RailConfig]:
    """All UP rails; topped up to the capacity floor with the best of the rest."""
    best = ranked(rails, ports)
    healthy = [r for r in best if ports[r.port].verdict is Verdict.UP]
    if len(healthy) >= min_paths:
        return healthy
    return best[:min_paths]


def probe_rails(config: Config) -> list[tuple[RailConfig, int]]:
    """Rails whose own path is kept for echo probes (all, when probing is on),
    each with its probe table."""
    return [(r, r.probe_table) for r in config.rails if config.probes.enabled and r.probe_table is not None]


def rules(config: Config, allocation: Allocation | None = None) -> list[Rule]:
    """Echo probes and replies from a rail address first (when probing is on),
    then RoCEv2 from a rail address, then anything from a rail address (a
    socket bound to a NIC's address means that NIC, as NCCL's socket transport
    binds), then multipath destinations for traffic bound to no rail.

    Rules do not depend on health: a table without a route lets the lookup
    fall through to the next rule, so the host never loses its main table.

    The order is the allocation's priorities (core.alloc keeps it); without
    an allocation, the one a fresh start would get. Sorted by priority."""
    allocation, config = _allocated(config, allocation)
    proto = config.ownership.route_protocol
    echo = config.probes.port
    out: list[Rule] = []
    for r in config.rails:
        out += [_rail_rule(r, role, allocation.priority(alloc.rail_rule_key(r.name, role)), proto, echo)
                for role in alloc.rail_rule_roles(config, r)]
    out += [Rule(priority=allocation.priority(alloc.group_rule_key(mp.name)), protocol=proto,
                 table=mp.table, dst=mp.destination) for mp in config.multipath]
    return sorted(out)


def _rail_rule(r: RailConfig, role: str, priority: int, proto: int, echo: int) -> Rule:
    """Rail r's rule in `role` (one of alloc.rail_rule_roles), matching its address."""
    src = f"{r.address}/32"
    if role == alloc.ROCE:
        return Rule(priority=priority, protocol=proto, table=r.table, src=src, ipproto=IPPROTO_UDP,
                    dport=ROCEV2_UDP_PORT)
    if role == alloc.SOURCE:
        return Rule(priority=priority, protocol=proto, table=r.table, src=src)
    if role not in (alloc.PROBE_OUT, alloc.PROBE_REPLY):
        raise ValueError(f"rail {r.name}: no rule role {role!r}")
    if r.probe_table is None:  # rail_rule_roles gives the probe roles only to a rail with a probe table
        raise ValueError(f"rail {r.name}: a {role} rule needs a probe table")
    if role == alloc.PROBE_OUT:
        return Rule(priority=priority, protocol=proto, table=r.probe_table, src=src, ipproto=IPPROTO_UDP,
                    dport=echo)
    return Rule(priority=priority, protocol=proto, table=r.probe_table, src=src, ipproto=IPPROTO_UDP,
                sport=echo)


def _allocated(config: Config, allocation: Allocation | None) -> tuple[Allocation, Config]:
    """The allocation to use (a fresh start's when none is given) and the
    config with its auto tables resolved through it."""
    if allocation is None:
        allocation = alloc.allocate(config, None)
    return allocation, alloc.resolve(config, allocation)


def decide(config: Config, ports: Mapping[str, PortState],
           allocation: Allocation | None = None) -> Decision:
    """The routing for these verdicts. The daemon passes its allocation
    (kept stable across reloads); without one, a fresh start's numbering."""
    allocation, config = _allocated(config, allocation)
    proto = config.ownership.route_protocol
    nh_of = {rail.name: allocation.nexthop_id(rail.name) for rail in config.rails}

    nexthops = {
        Nexthop(id=nh_of[rail.name], gateway=rail.gateway, port=rail.port, protocol=proto)
        for rail in config.rails if _usable(ports.get(rail.port))
    }

    routes: set[Route] = set()
    rail_status: list[RailStatus] = []
    for rail in config.rails:
        via = active_rail(config, rail, ports)
        rail_status.append(RailStatus(name=rail.name, port=rail.port, address=rail.address,
                                      table=rail.table, active_rail=via.name if via else None,
                                      active_port=via.port if via else None))
        if via is None:
            continue
        for dst in rail.destinations:
            routes.add(Route(table=rail.table, dst=dst, nhid=nh_of[via.name], protocol=proto))
    for rail, probe_table in probe_rails(config):
        if _usable(ports.get(rail.port)):
            for dst in rail.destinations:
                routes.add(Route(table=probe_table, dst=dst, nhid=nh_of[rail.name],
                                 protocol=proto))

    groups: set[NexthopGroup] = set()
    group_status: list[GroupStatus] = []
    for mp in config.multipath:
        members = group_members(config, [config.rail(n) for n in mp.rails], mp.min_paths, ports)
        group_status.append(GroupStatus(name=mp.name, destination=mp.destination, table=mp.table,
                                        members=tuple(r.name for r in members),
                                        min_paths=mp.min_paths))
        if not members:
            continue
        gid = allocation.group_id(mp.name)
        groups.add(NexthopGroup(id=gid, members=tuple(sorted(nh_of[r.name] for r in members)),
                                protocol=proto, resilient=True, buckets=mp.buckets,
                                idle_timer_s=mp.idle_timer_s,
                                unbalanced_timer_s=mp.unbalanced_timer_s))
        routes.add(Route(table=mp.table, dst=mp.destination, nhid=gid, protocol=proto))

    desired = KernelState(nexthops=frozenset(nexthops), groups=frozenset(groups),
                          routes=frozenset(routes), rules=frozenset(rules(config, allocation)))
    return Decision(desired=desired, rails=tuple(rail_status), groups=tuple(group_status))
