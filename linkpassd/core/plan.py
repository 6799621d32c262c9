"""Plan: desired vs observed kernel state -> ordered operations.

Make-before-break: new and changed nexthops first, then groups, then routes,
then new rules; only then are stale rules, routes, groups and nexthops
removed, so a route never points at something that does not exist yet and a
path is never removed before its replacement is in place.

`simulate` states the kernel's own semantics (deleting a nexthop shrinks its
groups and flushes routes through it; an empty group disappears), so that the
planner can account for them and tests can apply plans to a fake kernel.
Planning again after applying a plan yields no operations.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import replace
from typing import TypeVar

from linkpassd.core.model import (
    KernelState,
    Nexthop,
    NexthopGroup,
    Op,
    OpKind,
    Route,
    Rule,
)

_Upserted = TypeVar("_Upserted", Nexthop, NexthopGroup, Route)


class KernelSemanticsError(ValueError):
    """An operation the real kernel would refuse (used by the fake kernel)."""


def plan(desired: KernelState, observed: KernelState) -> list[Op]:
    ops: list[Op] = []

    # Ids whose object must change kind (nexthop <-> group) or whose resilient
    # table cannot be resized in place are deleted first; the kernel's side
    # effects of that are simulated so the rest of the plan sees them. This
    # breaks before it makes, so it is only the fallback: core.alloc gives a
    # group whose shape changes a fresh id (the old group is then simply an
    # observed group no longer wanted, deleted last, after its route moved).
    obs_nh = {nh.id: nh for nh in observed.nexthops}
    obs_grp = {g.id: g for g in observed.groups}
    doomed: list[Op] = []
    for g in sorted(desired.groups):
        if g.id in obs_nh:
            doomed.append(Op(OpKind.DELETE, obs_nh[g.id]))
        elif g.id in obs_grp and not _group_replaceable(obs_grp[g.id], g):
            doomed.append(Op(OpKind.DELETE, obs_grp[g.id]))
    for nh in sorted(desired.nexthops):
        if nh.id in obs_grp:
            doomed.append(Op(OpKind.DELETE, obs_grp[nh.id]))
    ops += doomed
    observed = simulate_all(observed, doomed)

    ops += _upserts(sorted(desired.nexthops), {nh.id: nh for nh in observed.nexthops}, lambda o: o.id)
    ops += _upserts(sorted(desired.groups), {g.id: g for g in observed.groups}, lambda o: o.id)
    ops += _upserts(sorted(desired.routes), {r.key: r for r in observed.routes}, lambda o: o.key)
    ops += [Op(OpKind.CREATE, r) for r in sorted(desired.rules - observed.rules)]

    ops += [Op(OpKind.DELETE, r) for r in sorted(observed.rules - desired.rules)]
    wanted_routes = {r.key for r in desired.routes}
    ops += [Op(OpKind.DELETE, r) for r in sorted(observed.routes) if r.key not in wanted_routes]
    wanted_ids = {g.id for g in desired.groups} | {nh.id for nh in desired.nexthops}
    ops += [Op(OpKind.DELETE, g) for g in sorted(observed.groups) if g.id not in wanted_ids]
    ops += [Op(OpKind.DELETE, nh) for nh in sorted(observed.nexthops) if nh.id not in wanted_ids]
    return ops


def _group_replaceable(old: NexthopGroup, new: NexthopGroup) -> bool:
    """The kernel cannot change a group's type or a resilient group's size in place."""
    return old.resilient == new.resilient and old.buckets == new.buckets


def _upserts(wanted: Iterable[_Upserted], existing: Mapping[Hashable, _Upserted],
             key: Callable[[_Upserted], Hashable]) -> list[Op]:
    out = []
    for obj in wanted:
        old = existing.get(key(obj))
        if old is None:
            out.append(Op(OpKind.CREATE, obj))
        elif old != obj:
            out.append(Op(OpKind.REPLACE, obj))
    return out


# --------------------------------------------------------------------------
# The kernel's semantics, as a pure function (for planning and for tests)
# --------------------------------------------------------------------------


def simulate_all(state: KernelState, ops: Iterable[Op]) -> KernelState:
    for op in ops:
        state = simulate(state, op)
    return state


def simulate(state: KernelState, op: Op) -> KernelState:
    obj = op.obj
    if isinstance(obj, Nexthop):
        return _sim_nexthop(state, op.kind, obj)
    if isinstance(obj, NexthopGroup):
        return _sim_group(state, op.kind, obj)
    if isinstance(obj, Route):
        return _sim_route(state, op.kind, obj)
    if isinstance(obj, Rule):
        return _sim_rule(state, op.kind, obj)
    raise TypeError(f"not a kernel object: {obj!r}")


def _ids(state: KernelState) -> set[int]:
    return {nh.id for nh in state.nexthops} | {g.id for g in state.groups}


def _sim_nexthop(state: KernelState, kind: OpKind, nh: Nexthop) -> KernelState:
    current = {n.id: n for n in state.nexthops}
    if kind is OpKind.DELETE:
        if nh.id not in current:
            raise KernelSemanticsError(f"no nexthop {nh.id}")
        return remove_nexthops(state, {nh.id})
    if kind is OpKind.CREATE and nh.id in _ids(state):
        raise KernelSemanticsError(f"nexthop id {nh.id} exists")
    if kind is OpKind.REPLACE and nh.id not in current:
        raise KernelSemanticsError(f"no nexthop {nh.id} to replace")
    kept = frozenset(n for n in state.nexthops if n.id != nh.id)
    return replace(state, nexthops=kept | {nh})


def _sim_group(state: KernelState, kind: OpKind, g: NexthopGroup) -> KernelState:
    current = {x.id: x for x in state.groups}
    if kind is OpKind.DELETE:
        if g.id not in current:
            raise KernelSemanticsError(f"no group {g.id}")
        return _flush_routes(replace(state, groups=frozenset(x for x in state.groups if x.id != g.id)), {g.id})
    nh_ids = {n.id for n in state.nexthops}
    missing = [m for m in g.members if m not in nh_ids]
    if missing or not g.members:
        raise KernelSemanticsError(f"group {g.id}: members {missing or 'none'} do not exist")
    if kind is OpKind.CREATE and g.id in _ids(state):
        raise KernelSemanticsError(f"nexthop id {g.id} exists")
    if kind is OpKind.REPLACE:
        if g.id not in current:
            raise KernelSemanticsError(f"no group {g.id} to replace")
        if not _group_replaceable(current[g.id], g):
            raise KernelSemanticsError(f"group {g.id}: cannot change type or bucket count in place")
    kept = frozenset(x for x in state.groups if x.id != g.id)
    return replace(state, groups=kept | {g})


def _sim_route(state: KernelState, kind: OpKind, r: Route) -> KernelState:
    current = {x.key: x for x in state.routes}
    if kind is OpKind.DELETE:
        if r.key not in current:
            raise KernelSemanticsError(f"no route {r.key}")
        return replace(state, routes=frozenset(x for x in state.routes if x.key != r.key))
    if r.nhid not in _ids(state):
        raise KernelSemanticsError(f"route {r.key}: nexthop {r.nhid} does not exist")
    if kind is OpKind.CREATE and r.key in current:
        raise KernelSemanticsError(f"route {r.key} exists")
    if kind is OpKind.REPLACE and r.key not in current:
        raise KernelSemanticsError(f"no route {r.key} to replace")
    kept = frozenset(x for x in state.routes if x.key != r.key)
    return replace(state, routes=kept | {r})


def _sim_rule(state: KernelState, kind: OpKind, r: Rule) -> KernelState:
    if kind is OpKind.DELETE:
        if r not in state.rules:
            raise KernelSemanticsError(f"no rule {r}")
        return replace(state, rules=state.rules - {r})
    if kind is OpKind.REPLACE:
        raise KernelSemanticsError("rules cannot be replaced")
    if r in state.rules:
        raise KernelSemanticsError(f"rule {r} exists")
    return replace(state, rules=state.rules | {r})


def remove_nexthops(state: KernelState, ids: set[int]) -> KernelState:
    """What the kernel does when nexthops go away (deleted, or their device
    lost carrier): groups shrink, empty groups vanish, routes through any of
    them are flushed."""
    gone = set(ids)
    groups = set()
    for g in state.groups:
        members = tuple(m for m in g.members if m not in gone)
        if members:
            groups.add(replace(g, members=members))
        else:
            gone.add(g.id)
    nexthops = frozenset(n for n in state.nexthops if n.id not in gone)
    return _flush_routes(replace(state, nexthops=nexthops, groups=frozenset(groups)), gone)


def carrier_lost(state: KernelState, port: str) -> KernelState:
    """The kernel deletes nexthops bound to a device that loses carrier."""
    return remove_nexthops(state, {n.id for n in state.nexthops if n.port == port})


def _flush_routes(state: KernelState, ids: set[int]) -> KernelState:
    return replace(state, routes=frozenset(r for r in state.routes if r.nhid not in ids))
