"""Allocation: nexthop ids, rule priorities and tables, by name and stable.

A reload must be make-before-break like any other change, so nothing may be
numbered by its position in the config: adding a rail would renumber the
multipath group (the kernel cannot re-id a group, so its route would be
flushed and its resilient bucket map lost) and shift every rule after it.
Here every kernel number belongs to a *name*, and keeps it as long as the name
exists; new names take free numbers; names that are gone release theirs.

* Nexthop ids: one per rail, one per multipath group *and shape*. The kernel
  cannot change a resilient group's type or bucket count in place, so a group
  whose shape changes gets a fresh id: the planner creates the new group,
  moves the route onto it and only then deletes the old group (which it
  deletes anyway, as an observed group no longer wanted). A fresh id is never
  one still present in the kernel (`reserved_ids`).
* Rule priorities keep policy.rules' order invariants: for one rail address,
  probe rules before the RoCE rule before the source rule; every rail rule
  before every multipath destination rule; of two overlapping multipath
  destinations, the more specific first (as a route lookup would choose). Rails take the lowest free priorities from
  the bottom of the range (a fresh start lays them out in one slot per rail),
  groups the highest free from the top, so adding a rail or a group moves no
  existing rule. Only when a kept layout cannot take a new rule (e.g. probes
  enabled on a host whose rail slots are full, or a host upgraded from
  positional numbering with no gap under the group rules) are the rules that
  block it moved, which is still make-before-break: a moved rule is created
  at its new priority before the old one is deleted.
* Tables: a table set in the config is that number; an auto table (the config
  left it to us, `Config.auto_tables`) keeps its number by name.

The allocation is persisted by the daemon (state_dir/allocation.json); when
the file is missing or corrupt, `derive` recovers it from what the kernel
shows, so a host upgraded from positional numbering renumbers nothing.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Iterable, Mapping, TypeVar

from linkpassd.core.model import Config, KernelState, MultipathConfig, RailConfig, Rule

FORMAT_VERSION = 1

# A rail's rules, in the order the kernel must evaluate them (lowest first).
PROBE_OUT, PROBE_REPLY, ROCE, SOURCE = "probe-out", "probe-reply", "roce", "source"
RAIL_RULE_ROLES = (PROBE_OUT, PROBE_REPLY, ROCE, SOURCE)


class AllocationError(ValueError):
    """An owned range cannot hold what the config needs; the message names it."""


class AllocationFileError(ValueError):
    """allocation.json is not a valid allocation; the message says where."""


def rail_rule_key(rail: str, role: str) -> str:
    return f"rail:{rail}:{role}"


def group_rule_key(group: str) -> str:
    return f"group:{group}"


def rail_table_key(rail: str) -> str:
    return f"rail:{rail}"


def probe_table_key(rail: str) -> str:
    return f"probe:{rail}"


def group_table_key(group: str) -> str:
    return f"group:{group}"


@dataclass(frozen=True, order=True)
class GroupId:
    """A multipath group's nexthop id, valid for one shape of the group."""

    id: int
    resilient: bool = True
    buckets: int = 64

    def fits(self, mp: MultipathConfig) -> bool:
        return (self.resilient, self.buckets) == group_shape(mp)


def group_shape(mp: MultipathConfig) -> tuple[bool, int]:
    """What the kernel cannot change in place (policy makes every group resilient)."""
    return (True, mp.buckets)


_V = TypeVar("_V")
_Table = TypeVar("_Table", int, int | None)  # a rail's table, or its probe table (None: none)
_Selector = tuple[str | None, str | None, int | None, int | None, int | None]  # a rule's match


def _frozen(mapping: Mapping[str, _V] | None) -> Mapping[str, _V]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class Allocation:
    """Name-keyed numbers. Keys: rail and group names for nexthop ids;
    rail_rule_key/group_rule_key for priorities; *_table_key for tables."""

    rail_nexthops: Mapping[str, int] = field(default_factory=dict)
    group_nexthops: Mapping[str, GroupId] = field(default_factory=dict)
    rule_priorities: Mapping[str, int] = field(default_factory=dict)
    tables: Mapping[str, int] = field(default_factory=dict)  # auto-allocated tables only

    def __post_init__(self) -> None:
        for name in ("rail_nexthops", "group_nexthops", "rule_priorities", "tables"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))

    def nexthop_id(self, rail: str) -> int:
        return _lookup(self.rail_nexthops, rail, "nexthop id of rail")

    def group_id(self, group: str) -> int:
        return _lookup(self.group_nexthops, group, "nexthop id of multipath group").id

    def priority(self, key: str) -> int:
        return _lookup(self.rule_priorities, key, "rule priority of")

    def to_json(self) -> dict[str, Any]:
        return {
            "version": FORMAT_VERSION,
            "rail_nexthops": dict(self.rail_nexthops),
            "group_nexthops": {name: {"id": g.id, "resilient": g.resilient, "buckets": g.buckets}
                               for name, g in self.group_nexthops.items()},
            "rule_priorities": dict(self.rule_priorities),
            "tables": dict(self.tables),
        }

    @staticmethod
    def from_json(doc: Any) -> "Allocation":
        """The inverse of to_json; AllocationFileError names the first bad entry."""
        if not isinstance(doc, dict):
            raise AllocationFileError(f"expected a JSON object, got {type(doc).__name__}")
        if doc.get("version") != FORMAT_VERSION:
            raise AllocationFileError(f"version: expected {FORMAT_VERSION}, got {doc.get('version')!r}")
        known = {"version", "rail_nexthops", "group_nexthops", "rule_priorities", "tables"}
        for key in doc:
            if key not in known:
                raise AllocationFileError(f"{key}: unknown key")
        groups = {}
        for name, raw in _object(doc, "group_nexthops").items():
            where = f"group_nexthops.{name}"
            if not isinstance(raw, dict) or set(raw) != {"id", "resilient", "buckets"}:
                raise AllocationFileError(f"{where}: expected an object with id, resilient, buckets")
            if not isinstance(raw["resilient"], bool):
                raise AllocationFileError(f"{where}.resilient: expected true or false")
            groups[name] = GroupId(id=_uint(raw["id"], f"{where}.id"), resilient=raw["resilient"],
                                   buckets=_uint(raw["buckets"], f"{where}.buckets"))
        return Allocation(
            rail_nexthops=_ints(doc, "rail_nexthops"),
            group_nexthops=groups,
            rule_priorities=_ints(doc, "rule_priorities"),
            tables=_ints(doc, "tables"),
        )


def _lookup(mapping: Mapping[str, _V], key: str, what: str) -> _V:
    try:
        return mapping[key]
    except KeyError:
        raise KeyError(f"no {what} {key!r} in the allocation; allocate() for this config first") from None


def _object(doc: dict[str, Any], key: str) -> dict[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        raise AllocationFileError(f"{key}: expected an object, got {type(value).__name__}")
    return value


def _uint(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**32:
        raise AllocationFileError(f"{where}: expected an integer 0..2^32-1, got {value!r}")
    return value


def _ints(doc: dict[str, Any], key: str) -> dict[str, int]:
    return {name: _uint(value, f"{key}.{name}") for name, value in _object(doc, key).items()}


# --------------------------------------------------------------------------
# Allocating
# --------------------------------------------------------------------------


def rail_rule_roles(config: Config, rail: RailConfig) -> list[str]:
    """The rules this rail has under the config, in evaluation order."""
    roles = []
    if config.probes.enabled and rail.probe_table is not None:
        roles += [PROBE_OUT, PROBE_REPLY]
    if config.roce_rules:
        roles.append(ROCE)
    return roles + [SOURCE]


def table_entries(config: Config) -> list[tuple[str, int | None]]:
    """Every table the config uses, keyed, in allocation order: rails, groups, probe tables."""
    out: list[tuple[str, int | None]] = [(rail_table_key(r.name), r.table) for r in config.rails]
    out += [(group_table_key(mp.name), mp.table) for mp in config.multipath]
    if config.probes.enabled:
        out += [(probe_table_key(r.name), r.probe_table) for r in config.rails]
    return out


def allocate(config: Config, previous: Allocation | None,
             reserved_ids: Iterable[int] = frozenset()) -> Allocation:
    """Numbers for everything `config` names: kept from `previous` by name where
    still valid, new ones from the free part of the owned ranges. New nexthop
    ids avoid `reserved_ids` (ids still present in the kernel). Pure and
    deterministic; AllocationError when a range is exhausted."""
    prev = previous or Allocation()
    rails, groups = _nexthop_ids(config, prev, frozenset(reserved_ids))
    return Allocation(rail_nexthops=rails, group_nexthops=groups,
                      rule_priorities=_RulePriorities(config, prev).allocate(),
                      tables=_tables(config, prev))


def _lowest_free(lo: int, hi: int, used: set[int] | frozenset[int]) -> int | None:
    candidate = lo
    while candidate <= hi and candidate in used:
        candidate += 1
    return candidate if candidate <= hi else None


def _exhausted(kind: str, lo: int, hi: int, detail: str) -> AllocationError:
    return AllocationError(f"[ownership] {kind}_min..{kind}_max range {lo}..{hi} is exhausted: {detail}")


def _nexthop_ids(config: Config, prev: Allocation,
                 reserved: frozenset[int]) -> tuple[dict[str, int], dict[str, GroupId]]:
    own = config.ownership
    lo, hi = own.nexthop_id_min, own.nexthop_id_max
    used: set[int] = set()
    rails: dict[str, int] = {}
    groups: dict[str, GroupId] = {}
    for rail in config.rails:
        old = prev.rail_nexthops.get(rail.name)
        if old is not None and lo <= old <= hi and old not in used:
            rails[rail.name] = old
            used.add(old)
    for mp in config.multipath:
        old_group = prev.group_nexthops.get(mp.name)
        if old_group is not None and old_group.fits(mp) and lo <= old_group.id <= hi \
                and old_group.id not in used:
            groups[mp.name] = old_group
            used.add(old_group.id)

    def fresh(what: str) -> int:
        nh_id = _lowest_free(lo, hi, used | reserved)
        if nh_id is None:
            pending = sorted(reserved - used)
            raise _exhausted("nexthop_id", lo, hi, f"no free id for {what}: {len(used)} in use"
                             + (f", {len(pending)} more still in the kernel until the next "
                                "reconcile deletes them" if pending else ""))
        used.add(nh_id)
        return nh_id

    for rail in config.rails:
        if rail.name not in rails:
            rails[rail.name] = fresh(f"rail {rail.name!r}")
    for mp in config.multipath:
        if mp.name not in groups:
            resilient, buckets = group_shape(mp)
            groups[mp.name] = GroupId(fresh(f"multipath group {mp.name!r}"), resilient, buckets)
    return rails, groups


def _tables(config: Config, prev: Allocation) -> dict[str, int]:
    own = config.ownership
    lo, hi = own.table_min, own.table_max
    entries = table_entries(config)
    auto = [key for key, _ in entries if key in config.auto_tables]
    used = {table for key, table in entries if key not in config.auto_tables and table is not None}
    out: dict[str, int] = {}
    for key in auto:
        old = prev.tables.get(key)
        if old is not None and lo <= old <= hi and old not in used:
            out[key] = old
            used.add(old)
    for key in auto:
        if key not in out:
            table = _lowest_free(lo, hi, used)
            if table is None:
                raise _exhausted("table", lo, hi, f"no free table for {key}")
            out[key] = table
            used.add(table)
    return {key: out[key] for key in auto}


class _RulePriorities:
    """Rails from the bottom, groups from the top, kept by name (see module doc)."""

    def __init__(self, config: Config, prev: Allocation) -> None:
        own = config.ownership
        self.lo, self.hi = own.rule_priority_min, own.rule_priority_max
        self.chains = [[rail_rule_key(r.name, role) for role in rail_rule_roles(config, r)]
                       for r in config.rails]
        self.groups = [group_rule_key(mp.name) for mp in config.multipath]
        self.nets = {group_rule_key(mp.name): ipaddress.ip_network(mp.destination, strict=False)
                     for mp in config.multipath}
        self.prev = prev.rule_priorities

    def allocate(self) -> dict[str, int]:
        used: set[int] = set()
        rails: dict[str, int] = {}
        for chain in self.chains:
            kept = self._kept_chain(chain, used)
            rails.update(kept)
            used.update(kept.values())
        floor = max(rails.values(), default=self.lo - 1)
        groups: dict[str, int] = {}
        for key in self.groups:
            old = self.prev.get(key)
            if old is not None and floor < old <= self.hi and old not in used \
                    and self._fits_group(key, old, groups):
                groups[key] = old
                used.add(old)
        for chain in self.chains:
            ceiling = min(groups.values(), default=self.hi + 1)
            placed = self._place_chain(chain, rails, used, ceiling)
            if placed is None:  # the kept part of this rail's rules leaves no room: move them
                used.difference_update(rails[k] for k in chain if k in rails)
                placed = self._place_chain(chain, {}, used, ceiling)
            if placed is None and groups:  # no room under the groups' rules: move them up
                used.difference_update(groups.values())
                groups.clear()
                placed = self._place_chain(chain, {}, used, self.hi + 1)
            if placed is None:
                raise _exhausted("rule_priority", self.lo, self.hi,
                                 f"no room for the rules of {chain[-1].rsplit(':', 1)[0]} "
                                 f"({len(used)} in use)")
            rails.update(placed)
            used.update(placed.values())
        floor = max(rails.values(), default=self.lo - 1)
        if not self._place_groups(groups, used, floor):
            # The kept group rules leave no room in the right order: lay all
            # of them out again from the top, widest destination highest.
            used.difference_update(groups.values())
            groups.clear()
            if not self._place_groups(groups, used, floor):
                raise _exhausted("rule_priority", self.lo, self.hi,
                                 f"no room for the multipath rules above the rails' rules "
                                 f"({len(used)} in use)")
        return {**rails, **groups}

    def _place_groups(self, groups: dict[str, int], used: set[int], floor: int) -> bool:
        """Place the groups missing from `groups` (widest first); False when one
        does not fit (nothing is placed then)."""
        placed: dict[str, int] = {}
        taken = set(used)
        order = sorted((k for k in self.groups if k not in groups),
                       key=lambda k: (self.nets[k].prefixlen, self.groups.index(k)))
        for key in order:
            prio = self._place_group(key, {**groups, **placed}, taken, floor)
            if prio is None:
                return False
            placed[key] = prio
            taken.add(prio)
        groups.update(placed)
        used.update(placed.values())
        return True

    def _kept_chain(self, chain: list[str], used: set[int]) -> dict[str, int]:
        """The chain's previous priorities, if in range, unused and in order."""
        kept = {k: self.prev[k] for k in chain if k in self.prev}
        values = [kept[k] for k in chain if k in kept]
        if (any(not self.lo <= v <= self.hi or v in used for v in values)
                or values != sorted(set(values))):
            return {}
        return kept

    def _place_chain(self, chain: list[str], kept: dict[str, int], used: set[int],
                     ceiling: int) -> dict[str, int] | None:
        """Lowest free priorities for the chain's missing rules, in chain order,
        between its kept neighbours and below `ceiling`."""
        out: dict[str, int] = {}
        taken = set(used)
        lower = self.lo - 1
        for i, key in enumerate(chain):
            if key in kept:
                if kept[key] >= ceiling:
                    return None
                out[key] = lower = kept[key]
                continue
            upper = next((kept[k] for k in chain[i + 1:] if k in kept), ceiling)
            prio = _lowest_free(lower + 1, min(upper, ceiling) - 1, taken)
            if prio is None:
                return None
            out[key] = lower = prio
            taken.add(prio)
        return out

    def _overlapping(self, key: str) -> tuple[list[str], list[str]]:
        """Groups whose destinations overlap this one's: the more specific
        (their rules must come first) and the wider (theirs after)."""
        def rank(k: str) -> tuple[int, int]:
            return (-self.nets[k].prefixlen, self.groups.index(k))
        net = self.nets[key]
        overlaps = [k for k in self.groups if k != key and self.nets[k].overlaps(net)]
        return ([k for k in overlaps if rank(k) < rank(key)],
                [k for k in overlaps if rank(k) > rank(key)])

    def _fits_group(self, key: str, prio: int, placed: dict[str, int]) -> bool:
        before, after = self._overlapping(key)
        return (all(placed[k] < prio for k in before if k in placed)
                and all(placed[k] > prio for k in after if k in placed))

    def _place_group(self, key: str, placed: dict[str, int], used: set[int],
                     floor: int) -> int | None:
        """The highest free priority above the rails' rules that keeps
        overlapping destinations in config order."""
        before, after = self._overlapping(key)
        lower = max([floor] + [placed[k] for k in before if k in placed])
        upper = min([self.hi + 1] + [placed[k] for k in after if k in placed])
        prio = upper - 1
        while prio > lower and prio in used:
            prio -= 1
        return prio if prio > lower else None


# --------------------------------------------------------------------------
# Applying an allocation to a config, and recovering one from the kernel
# --------------------------------------------------------------------------


def resolve(config: Config, allocation: Allocation) -> Config:
    """The config with its auto tables replaced by the allocated ones: what
    policy, status and explain read. Idempotent."""
    tables = allocation.tables
    if not config.auto_tables:
        return config

    def table(key: str, current: _Table) -> _Table:
        return tables.get(key, current) if key in config.auto_tables else current

    rails = tuple(replace(r, table=table(rail_table_key(r.name), r.table),
                          probe_table=table(probe_table_key(r.name), r.probe_table))
                  for r in config.rails)
    groups = tuple(replace(mp, table=table(group_table_key(mp.name), mp.table))
                   for mp in config.multipath)
    return replace(config, rails=rails, multipath=groups)


def derive(config: Config, observed: KernelState) -> Allocation:
    """What the kernel shows of an earlier allocation, for a start without a
    usable allocation.json (first start after an upgrade, or a corrupt file):
    an owned nexthop's port names its rail; a rule's selector names its rail
    or group (and so its priority and table); the multipath route in the
    group's table names the group's id. Pass the result to `allocate`, which
    drops anything inconsistent and fills in the rest."""
    rail_nexthops: dict[str, int] = {}
    for rail in config.rails:
        ids = sorted(nh.id for nh in observed.nexthops if nh.port == rail.port)
        if ids:
            rail_nexthops[rail.name] = ids[0]

    by_selector: dict[_Selector, list[Rule]] = {}
    for rule in sorted(observed.rules):
        by_selector.setdefault((rule.src, rule.dst, rule.ipproto, rule.dport, rule.sport),
                               []).append(rule)
    echo, udp = config.probes.port, 17
    priorities: dict[str, int] = {}
    tables: dict[str, int] = {}

    def found(key: str, selector: _Selector, table_key: str | None = None) -> None:
        rules = by_selector.get(selector)
        if not rules:
            return
        priorities[key] = rules[0].priority
        if table_key is not None and table_key in config.auto_tables:
            tables.setdefault(table_key, rules[0].table)

    for rail in config.rails:
        src = f"{rail.address}/32"
        found(rail_rule_key(rail.name, SOURCE), (src, None, None, None, None),
              rail_table_key(rail.name))
        found(rail_rule_key(rail.name, ROCE), (src, None, udp, 4791, None))
        found(rail_rule_key(rail.name, PROBE_OUT), (src, None, udp, echo, None),
              probe_table_key(rail.name))
        found(rail_rule_key(rail.name, PROBE_REPLY), (src, None, udp, None, echo),
              probe_table_key(rail.name))
    for mp in config.multipath:
        found(group_rule_key(mp.name), (None, mp.destination, None, None, None),
              group_table_key(mp.name))

    group_nexthops: dict[str, GroupId] = {}
    observed_groups = {g.id: g for g in observed.groups}
    for mp in config.multipath:
        key = group_table_key(mp.name)
        table = tables.get(key) if key in config.auto_tables else mp.table
        # The route to the destination through a group: in the group's table,
        # or (its rule gone) in whichever owned table has it.
        routes = sorted((r for r in observed.routes
                         if r.dst == mp.destination and r.nhid in observed_groups),
                        key=lambda r: (r.table != table, r.table))
        if not routes:
            continue
        group = observed_groups[routes[0].nhid]
        group_nexthops[mp.name] = GroupId(group.id, group.resilient, group.buckets)
        if key in config.auto_tables:
            tables.setdefault(key, routes[0].table)
    return Allocation(rail_nexthops=rail_nexthops, group_nexthops=group_nexthops,
                      rule_priorities=priorities, tables=tables)


def kernel_ids(observed: KernelState) -> frozenset[int]:
    """Every owned nexthop id the kernel holds: not to be handed out anew."""
    return frozenset(nh.id for nh in observed.nexthops) | frozenset(g.id for g in observed.groups)
