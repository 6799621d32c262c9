"""Allocation: numbers by name, stable across reloads and restarts (core.alloc)."""

import ipaddress
import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corefixtures import ports
from linkpassd.config import parse_config
from linkpassd.core import alloc, policy
from linkpassd.core import plan as planner
from linkpassd.core.alloc import Allocation, AllocationError, AllocationFileError, GroupId
from linkpassd.core.model import Config, KernelState, MultipathConfig, Ownership, ProbeSettings, RailConfig, Rule

RAIL_POOL = [f"rail{i}" for i in range(6)]


def rail(name: str, probes: bool = False) -> RailConfig:
    i = int(name.removeprefix("rail"))
    return RailConfig(name=name, port=f"eth{i}", address=f"198.18.{i}.1", prefixlen=24,
                      gateway=f"198.18.{i}.254", table=0, probe_table=0 if probes else None,
                      probe_peers=(f"198.19.{i}.9",) if probes else ())


def group(name: str, members, buckets: int = 16, destination: str | None = None) -> MultipathConfig:
    j = int(name.removeprefix("g"))
    return MultipathConfig(name=name, destination=destination or f"198.19.{j * 64}.0/18",
                           rails=tuple(members), table=0, buckets=buckets)


def config(rails, groups=(), roce=True, probes=False, ownership=Ownership()) -> Config:
    """Every table left to the allocator, as in a file that sets none."""
    rails = tuple(rail(n, probes) for n in rails)
    cfg = Config(rails=rails, multipath=tuple(groups), roce_rules=roce, ownership=ownership,
                 probes=ProbeSettings(enabled=probes))
    return replace(cfg, auto_tables=frozenset(k for k, _ in alloc.table_entries(cfg)))


def check_invariants(cfg: Config, a: Allocation) -> None:
    own = cfg.ownership
    ids = list(a.rail_nexthops.values()) + [g.id for g in a.group_nexthops.values()]
    assert len(ids) == len(set(ids)) and all(own.owns_nexthop_id(i) for i in ids)
    prios = list(a.rule_priorities.values())
    assert len(prios) == len(set(prios)) and all(own.owns_rule_priority(p) for p in prios)
    resolved = alloc.resolve(cfg, a)
    tables = [t for _, t in alloc.table_entries(resolved)]
    assert len(tables) == len(set(tables)) and all(own.owns_table(t) for t in tables)
    assert set(a.rail_nexthops) == {r.name for r in cfg.rails}
    assert set(a.group_nexthops) == {g.name for g in cfg.multipath}
    assert all(a.group_nexthops[g.name].fits(g) for g in cfg.multipath)
    # policy.rules' order: per rail address probe < RoCE < source; rails before groups
    rail_prios = []
    for r in cfg.rails:
        chain = [a.priority(alloc.rail_rule_key(r.name, role))
                 for role in alloc.rail_rule_roles(cfg, r)]
        assert chain == sorted(chain), f"{r.name}'s rules out of order: {chain}"
        rail_prios += chain
    group_prios = [a.priority(alloc.group_rule_key(g.name)) for g in cfg.multipath]
    if rail_prios and group_prios:
        assert max(rail_prios) < min(group_prios)
    for i, g in enumerate(cfg.multipath):
        for h in cfg.multipath[i + 1:]:
            g_net, h_net = ipaddress.ip_network(g.destination), ipaddress.ip_network(h.destination)
            if g_net.overlaps(h_net):  # the more specific destination's rule first
                narrow, wide = (g, h) if g_net.prefixlen > h_net.prefixlen else (h, g)
                assert (a.priority(alloc.group_rule_key(narrow.name))
                        < a.priority(alloc.group_rule_key(wide.name)))


# --------------------------------------------------------------------------
# Stability
# --------------------------------------------------------------------------


def test_a_fresh_start_numbers_like_the_config_builder_and_lays_rules_out_in_slots():
    cfg = parse_config("""
[[rail]]
name = "a"
port = "eth0"
address = "198.18.0.1/24"
gateway = "198.18.0.254"
[[rail]]
name = "b"
port = "eth1"
address = "198.18.1.1/24"
gateway = "198.18.1.254"
table = 10100
[[multipath]]
name = "fabric"
destination = "198.19.0.0/16"
rails = ["a", "b"]
""")
    a = alloc.allocate(cfg, None)
    assert alloc.resolve(cfg, a) == cfg  # the builder's fresh choice is the allocator's
    assert cfg.rail("a").table == 10101 and cfg.multipath[0].table == 10102
    assert dict(a.rail_nexthops) == {"a": 1_000_100, "b": 1_000_101}
    assert a.group_id("fabric") == 1_000_102
    assert dict(a.rule_priorities) == {"rail:a:roce": 10100, "rail:a:source": 10101,
                                       "rail:b:roce": 10102, "rail:b:source": 10103,
                                       "group:fabric": 10199}


def test_adding_a_rail_changes_no_existing_number():
    before_cfg = config(["rail0", "rail1"], [group("g0", ["rail0", "rail1"])])
    before = alloc.allocate(before_cfg, None)
    after_cfg = config(["rail2", "rail0", "rail1"], [group("g0", ["rail0", "rail1"])])
    after = alloc.allocate(after_cfg, before)
    check_invariants(after_cfg, after)
    for field in ("rail_nexthops", "group_nexthops", "rule_priorities", "tables"):
        old, new = getattr(before, field), getattr(after, field)
        assert {k: new[k] for k in old} == dict(old), field
    assert after.nexthop_id("rail2") == 1_000_103  # the lowest free id, not rail2's position
    assert after.tables["rail:rail2"] == 10103


def test_removed_names_release_their_numbers_for_new_ones():
    cfg = config(["rail0", "rail1", "rail2"], [group("g0", ["rail0", "rail2"])])
    first = alloc.allocate(cfg, None)
    without = alloc.allocate(config(["rail0", "rail2"], [group("g0", ["rail0", "rail2"])]), first)
    assert "rail1" not in without.rail_nexthops and "rail:rail1" not in without.tables
    again = alloc.allocate(config(["rail0", "rail2", "rail5"], [group("g0", ["rail0", "rail2"])]),
                           without)
    assert again.nexthop_id("rail5") == first.nexthop_id("rail1")
    assert again.tables["rail:rail5"] == first.tables["rail:rail1"]
    assert (again.priority("rail:rail5:roce"), again.priority("rail:rail5:source")) == (
        first.priority("rail:rail1:roce"), first.priority("rail:rail1:source"))


def test_adding_a_group_takes_the_highest_free_priority_and_moves_nothing():
    cfg1 = config(["rail0", "rail1"], [group("g0", ["rail0", "rail1"])])
    a1 = alloc.allocate(cfg1, None)
    cfg2 = config(["rail0", "rail1"], [group("g1", ["rail1"]), group("g0", ["rail0", "rail1"])])
    a2 = alloc.allocate(cfg2, a1)
    check_invariants(cfg2, a2)
    assert a2.priority("group:g0") == 10199 and a2.priority("group:g1") == 10198
    assert {k: a2.rule_priorities[k] for k in a1.rule_priorities} == dict(a1.rule_priorities)


@pytest.mark.parametrize("narrow_first", [False, True])
def test_overlapping_destinations_put_the_more_specific_first(narrow_first):
    wide = group("g0", ["rail0"], destination="198.19.0.0/16")
    narrow = group("g1", ["rail0"], destination="198.19.1.0/24")
    first, second = (narrow, wide) if narrow_first else (wide, narrow)
    a1 = alloc.allocate(config(["rail0"], [first]), None)
    cfg = config(["rail0"], [wide, narrow])
    a2 = alloc.allocate(cfg, a1)
    check_invariants(cfg, a2)
    assert a2.priority("group:g1") < a2.priority("group:g0")
    if not narrow_first:  # a narrower group fits under the kept wide one
        assert a2.priority("group:g0") == a1.priority("group:g0")
    # (a wider group added over a kept narrow one at the top moves it down)


def test_a_shape_change_gets_a_fresh_id_never_one_still_in_the_kernel():
    cfg8 = config(["rail0", "rail1"], [group("g0", ["rail0", "rail1"], buckets=8)])
    a8 = alloc.allocate(cfg8, None)
    kernel = policy.decide(cfg8, ports(cfg8), a8).desired
    # a stray owned nexthop at the next free id, left in the kernel by an older config
    reserved = alloc.kernel_ids(kernel) | {1_000_103}
    cfg16 = config(["rail0", "rail1"], [group("g0", ["rail0", "rail1"], buckets=16)])
    a16 = alloc.allocate(cfg16, a8, reserved_ids=reserved)
    assert a16.group_id("g0") == 1_000_104
    assert a16.group_nexthops["g0"] == GroupId(1_000_104, True, 16)
    assert dict(a16.rail_nexthops) == dict(a8.rail_nexthops)
    # and back: the old id is free again once the old group is gone from the kernel
    back = alloc.allocate(cfg8, a16, reserved_ids={1_000_100, 1_000_101, 1_000_104})
    assert back.group_id("g0") == 1_000_102


def test_toggling_probes_keeps_every_rail_rule_in_order():
    plain = config(["rail0", "rail1"], [group("g0", ["rail0", "rail1"])])
    a1 = alloc.allocate(plain, None)
    probing = config(["rail0", "rail1"], [group("g0", ["rail0", "rail1"])], probes=True)
    a2 = alloc.allocate(probing, a1)
    check_invariants(probing, a2)
    assert a2.priority("group:g0") == a1.priority("group:g0")
    check_invariants(plain, alloc.allocate(plain, a2))


def test_invalid_previous_entries_are_dropped_not_trusted():
    cfg = config(["rail0", "rail1"], [group("g0", ["rail0", "rail1"])])
    junk = Allocation(rail_nexthops={"rail0": 5, "rail1": 1_000_107, "gone": 1_000_100},
                      group_nexthops={"g0": GroupId(1_000_107, True, 16)},  # same id twice
                      rule_priorities={"rail:rail0:roce": 10150, "rail:rail0:source": 10120,
                                       "group:g0": 10110, "rail:rail1:source": 3},
                      tables={"rail:rail0": 99, "rail:rail1": 10100, "group:g0": 10100})
    a = alloc.allocate(cfg, junk)
    check_invariants(cfg, a)
    assert a.nexthop_id("rail1") == 1_000_107 and a.group_id("g0") != 1_000_107
    assert a.tables["rail:rail1"] == 10100


# --------------------------------------------------------------------------
# Capacity
# --------------------------------------------------------------------------


def test_exhausted_nexthop_range_is_named():
    tight = Ownership(nexthop_id_min=1_000_100, nexthop_id_max=1_000_102)
    cfg = config(["rail0", "rail1"], [group("g0", ["rail0", "rail1"], buckets=8)], ownership=tight)
    a = alloc.allocate(cfg, None)
    bigger = config(["rail0", "rail1"], [group("g0", ["rail0", "rail1"], buckets=16)],
                    ownership=tight)
    with pytest.raises(AllocationError, match=r"nexthop_id_min\.\.nexthop_id_max range "
                       r"1000100\.\.1000102 is exhausted: no free id for multipath group 'g0'.*"
                       r"1 more still in the kernel"):
        alloc.allocate(bigger, a, reserved_ids={1_000_100, 1_000_101, 1_000_102})


def test_exhausted_rule_priority_range_is_named():
    tight = Ownership(rule_priority_min=10100, rule_priority_max=10104)
    cfg = config(["rail0", "rail1"], [group("g0", ["rail0"])], ownership=tight)
    a = alloc.allocate(cfg, None)  # 2 + 2 + 1: exactly full
    check_invariants(cfg, a)
    with pytest.raises(AllocationError, match=r"rule_priority_min\.\.rule_priority_max range "
                       r"10100\.\.10104 is exhausted"):
        alloc.allocate(config(["rail0", "rail1", "rail2"], [group("g0", ["rail0"])],
                              ownership=tight), a)


def test_exhausted_table_range_is_named():
    tight = Ownership(table_min=10100, table_max=10101)
    with pytest.raises(AllocationError, match=r"table_min\.\.table_max range 10100\.\.10101"):
        alloc.allocate(config(["rail0", "rail1"], [group("g0", ["rail0"])], ownership=tight), None)


def test_full_rails_move_the_group_rules_up_rather_than_fail():
    """A host upgraded from positional numbering has no gap under its group
    rule; a new rail then moves the group rule (make-before-break)."""
    cfg = config(["rail0", "rail1"], [group("g0", ["rail0", "rail1"])])
    legacy = positional(cfg)
    bigger = config(["rail0", "rail1", "rail2"], [group("g0", ["rail0", "rail1"])])
    a = alloc.allocate(bigger, legacy)
    check_invariants(bigger, a)
    assert {k: a.rule_priorities[k] for k in legacy.rule_priorities if k != "group:g0"} == {
        k: v for k, v in legacy.rule_priorities.items() if k != "group:g0"}


# --------------------------------------------------------------------------
# Persistence and derivation from the kernel
# --------------------------------------------------------------------------


def test_json_round_trip():
    cfg = config(["rail0", "rail1"], [group("g0", ["rail0", "rail1"])], probes=True)
    a = alloc.allocate(cfg, None)
    assert Allocation.from_json(json.loads(json.dumps(a.to_json()))) == a


@pytest.mark.parametrize("doc,where", [
    ([], "expected a JSON object"),
    ({"version": 2}, "version"),
    ({"version": 1, "extra": {}}, "extra: unknown key"),
    ({"version": 1, "rail_nexthops": {"rail0": "7"}}, "rail_nexthops.rail0"),
    ({"version": 1, "rail_nexthops": {"rail0": True}}, "rail_nexthops.rail0"),
    ({"version": 1, "tables": []}, "tables: expected an object"),
    ({"version": 1, "rule_priorities": {"x": -1}}, "rule_priorities.x"),
    ({"version": 1, "group_nexthops": {"g": {"id": 1}}}, "group_nexthops.g"),
    ({"version": 1, "group_nexthops": {"g": {"id": 1, "resilient": 1, "buckets": 8}}},
     "group_nexthops.g.resilient"),
])
def test_a_corrupt_file_is_refused_with_the_bad_entry_named(doc, where):
    with pytest.raises(AllocationFileError, match=where):
        Allocation.from_json(doc)


def positional(cfg: Config) -> Allocation:
    """How linkpassd numbered things before allocation (by position)."""
    own = cfg.ownership
    rails = {r.name: own.nexthop_id_min + i for i, r in enumerate(cfg.rails)}
    groups = {g.name: GroupId(own.nexthop_id_min + len(cfg.rails) + j, True, g.buckets)
              for j, g in enumerate(cfg.multipath)}
    keys = [alloc.rail_rule_key(r.name, role) for role in alloc.RAIL_RULE_ROLES
            for r in cfg.rails if role in alloc.rail_rule_roles(cfg, r)]
    keys += [alloc.group_rule_key(g.name) for g in cfg.multipath]
    return Allocation(rail_nexthops=rails, group_nexthops=groups,
                      rule_priorities={k: own.rule_priority_min + i for i, k in enumerate(keys)},
                      tables=alloc.allocate(cfg, None).tables)


@pytest.mark.parametrize("probes", [False, True])
def test_an_upgraded_host_is_derived_from_the_kernel_and_nothing_is_renumbered(probes):
    cfg = config(["rail0", "rail1", "rail2"], [group("g0", ["rail0", "rail1"]),
                                              group("g1", ["rail2", "rail1"], buckets=32)],
                 probes=probes)
    legacy = positional(cfg)
    kernel = policy.decide(cfg, ports(cfg), legacy).desired
    derived = alloc.derive(cfg, kernel)
    a = alloc.allocate(cfg, derived, reserved_ids=alloc.kernel_ids(kernel))
    assert a == legacy
    assert planner.plan(policy.decide(cfg, ports(cfg), a).desired, kernel) == []


def test_derivation_skips_what_the_kernel_does_not_show():
    cfg = config(["rail0", "rail1"], [group("g0", ["rail0", "rail1"])])
    kernel = policy.decide(cfg, ports(cfg), alloc.allocate(cfg, None)).desired
    rule = next(r for r in kernel.rules if r.dst is not None)
    partial = replace(planner.carrier_lost(kernel, "eth0"), rules=kernel.rules - {rule})
    derived = alloc.derive(cfg, partial)
    assert "rail0" not in derived.rail_nexthops and "group:g0" not in derived.rule_priorities
    assert derived.group_nexthops["g0"].id == 1_000_102  # its route is still there (via rail1)
    check_invariants(cfg, alloc.allocate(cfg, derived, alloc.kernel_ids(partial)))
    assert alloc.derive(cfg, KernelState()) == Allocation()


def test_rules_of_another_selector_are_not_taken_for_ours():
    cfg = config(["rail0"])
    foreign = Rule(priority=10150, table=10100, protocol=201, src="198.18.0.1/32", ipproto=6)
    assert alloc.derive(cfg, KernelState(rules=frozenset({foreign}))) == Allocation()


# --------------------------------------------------------------------------
# Properties over random sequences of reloads
# --------------------------------------------------------------------------


@st.composite
def configs(draw, roce: bool, probes: bool):
    names = draw(st.lists(st.sampled_from(RAIL_POOL), min_size=1, max_size=6, unique=True))
    groups = []
    for g in draw(st.lists(st.sampled_from(["g0", "g1", "g2"]), max_size=3, unique=True)):
        members = draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
        groups.append(group(g, members, buckets=draw(st.sampled_from([8, 16])),
                            destination=draw(st.sampled_from([None, "198.19.0.0/16"]))
                            if g != "g0" else None))
    destinations = [g.destination for g in groups]
    if len(set(destinations)) != len(destinations):  # the config refuses duplicates
        groups = groups[:1]
    return config(names, groups, roce=roce, probes=probes)


@st.composite
def reload_sequences(draw):
    roce, probes = draw(st.booleans()), draw(st.booleans())
    return draw(st.lists(configs(roce, probes), min_size=1, max_size=6))


@settings(max_examples=200, deadline=None)
@given(sequence=reload_sequences())
def test_reloads_keep_every_kept_name_and_the_rule_order(sequence):
    """Over any sequence of reloads (rails and groups added, removed,
    reordered, groups resized): every number stays with its name (a group
    only changes id with its shape, and never to an id still in the kernel),
    the order invariants hold, and applying each plan to the fake kernel
    never removes, even for a moment, a route that exists before and after."""
    previous, prev_cfg, kernel = None, None, KernelState()
    for cfg in sequence:
        reserved = alloc.kernel_ids(kernel)
        a = alloc.allocate(cfg, previous, reserved_ids=reserved)
        check_invariants(cfg, a)
        if previous is not None:
            for name, nh_id in a.rail_nexthops.items():
                if name in previous.rail_nexthops:
                    assert nh_id == previous.rail_nexthops[name]
            for name, gid in a.group_nexthops.items():
                old = previous.group_nexthops.get(name)
                if old is not None and (old.resilient, old.buckets) == (gid.resilient, gid.buckets):
                    assert gid == old
                elif old is not None:
                    assert gid.id not in reserved
            moved_by_wider = wider_groups_added(prev_cfg, cfg)
            for key, prio in a.rule_priorities.items():
                if key in previous.rule_priorities and key not in moved_by_wider:
                    assert prio == previous.rule_priorities[key], key
            for key, table in a.tables.items():
                if key in previous.tables:
                    assert table == previous.tables[key]
        desired = policy.decide(cfg, ports(cfg), a).desired
        kept = {r.key for r in kernel.routes} & {r.key for r in desired.routes}
        for op in planner.plan(desired, kernel):
            kernel = planner.simulate(kernel, op)
            present = {r.key for r in kernel.routes}
            assert kept <= present, f"{op} removed a route that should have stayed"
        assert kernel == desired and planner.plan(desired, kernel) == []
        previous = Allocation.from_json(a.to_json())  # through the file, as across a restart
        prev_cfg = cfg


def wider_groups_added(before: Config, after: Config) -> set[str]:
    """Group rules a new, wider, overlapping destination may push down (the
    one move adding a group can cause: the top of the range has no room above),
    and the new one's own rule, when that happens."""
    old = {g.name: g.destination for g in before.multipath}
    nets = {g.name: ipaddress.ip_network(g.destination) for g in after.multipath}
    new = {g.name for g in after.multipath if old.get(g.name) != g.destination}
    pushed = {alloc.group_rule_key(g) for g in set(old) & set(nets) for n in new
              if n != g and nets[n].overlaps(nets[g]) and nets[n].prefixlen < nets[g].prefixlen}
    return pushed | {alloc.group_rule_key(n) for n in new} if pushed else set()
