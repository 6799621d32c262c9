"""Policy: verdicts + config -> desired routing."""

from hypothesis import given, settings
from hypothesis import strategies as st

from corefixtures import port, ports, rails_config
from linkpassd.core import alloc, policy
from linkpassd.core.model import Verdict


def nh(cfg, rail_index):
    """The nexthop id of a rail, as a fresh start allocates it."""
    return alloc.allocate(cfg, None).nexthop_id(cfg.rails[rail_index].name)


def route_nh(decision, table):
    (route,) = [r for r in decision.desired.routes if r.table == table]
    return route.nhid


def test_all_up_each_rail_uses_its_own_nexthop_and_group_has_all():
    cfg = rails_config(2)
    d = policy.decide(cfg, ports(cfg))
    assert route_nh(d, 10100) == nh(cfg, 0)
    assert route_nh(d, 10101) == nh(cfg, 1)
    (group,) = d.desired.groups
    assert group.members == (nh(cfg, 0), nh(cfg, 1))
    assert group.resilient and group.buckets == 16
    assert [r.active_rail for r in d.rails] == ["rail0", "rail1"]


def test_down_rail_table_fails_over_to_first_backup_in_order():
    cfg = rails_config(3)
    d = policy.decide(cfg, ports(cfg, eth0=port("eth0", Verdict.DOWN)))
    assert route_nh(d, 10100) == nh(cfg, 1)  # rail0's backups: rail1, rail2
    assert d.rails[0].active_rail == "rail1" and d.rails[0].active_port == "eth1"
    d = policy.decide(cfg, ports(cfg, eth0=port("eth0", Verdict.DOWN), eth1=port("eth1", Verdict.DOWN)))
    assert route_nh(d, 10100) == nh(cfg, 2)
    (group,) = d.desired.groups
    assert group.members == (nh(cfg, 2),)


def test_no_nexthop_is_desired_on_a_port_without_carrier():
    cfg = rails_config(2)
    d = policy.decide(cfg, ports(cfg, eth0=port("eth0", Verdict.DOWN)))
    assert {nh.port for nh in d.desired.nexthops} == {"eth1"}


def test_recovering_port_keeps_nexthop_ready_but_traffic_stays_on_backup():
    cfg = rails_config(2)
    d = policy.decide(cfg, ports(cfg, eth0=port("eth0", Verdict.DOWN, carrier=True)))
    assert {nh.port for nh in d.desired.nexthops} == {"eth0", "eth1"}
    assert route_nh(d, 10100) == nh(cfg, 1)


def test_recovering_port_is_used_when_nothing_better_has_carrier():
    cfg = rails_config(2)
    d = policy.decide(cfg, ports(cfg, eth0=port("eth0", Verdict.DOWN, carrier=True),
                                 eth1=port("eth1", Verdict.DOWN)))
    assert route_nh(d, 10100) == nh(cfg, 0)
    assert route_nh(d, 10101) == nh(cfg, 0)


def test_degraded_is_preferred_to_recovering_and_up_to_degraded():
    cfg = rails_config(3)
    st_ = ports(cfg, eth0=port("eth0", Verdict.DOWN), eth1=port("eth1", Verdict.DOWN, carrier=True),
                eth2=port("eth2", Verdict.DEGRADED))
    d = policy.decide(cfg, st_)
    assert route_nh(d, 10100) == nh(cfg, 2)


def test_capacity_floor_keeps_min_paths_members():
    cfg = rails_config(3, min_paths=2)
    d = policy.decide(cfg, ports(cfg, eth1=port("eth1", Verdict.DEGRADED), eth2=port("eth2", Verdict.DEGRADED)))
    (group,) = d.desired.groups
    # rail0 is UP; the floor of 2 adds the best other candidate, rail1 (configured order)
    assert group.members == (nh(cfg, 0), nh(cfg, 1))
    assert d.groups[0].members == ("rail0", "rail1")


def test_degraded_members_leave_the_group_when_enough_up_remain():
    cfg = rails_config(3, min_paths=1)
    d = policy.decide(cfg, ports(cfg, eth1=port("eth1", Verdict.DEGRADED)))
    (group,) = d.desired.groups
    assert group.members == (nh(cfg, 0), nh(cfg, 2))


def test_without_any_carrier_there_is_no_route_and_rules_stay():
    cfg = rails_config(2)
    d = policy.decide(cfg, {p: port(p, Verdict.DOWN) for p in ("eth0", "eth1")})
    assert not d.desired.routes and not d.desired.groups and not d.desired.nexthops
    assert len(d.desired.rules) == 2 + 1 + 2
    assert [r.active_rail for r in d.rails] == [None, None]


def test_rules_cover_roce_then_rail_sources_then_multipath():
    """A fresh start: one slot per rail from the bottom of the range (RoCE
    rule, then source rule), the multipath rule at the top."""
    cfg = rails_config(2)
    rules = policy.rules(cfg)
    assert [(r.priority, r.src, r.dport, r.dst, r.table) for r in rules] == [
        (10100, "198.18.0.1/32", 4791, None, 10100), (10101, "198.18.0.1/32", None, None, 10100),
        (10102, "198.18.1.1/32", 4791, None, 10101), (10103, "198.18.1.1/32", None, None, 10101),
        (10199, None, None, "198.19.0.0/16", 10150)]


def test_without_roce_rules_the_rail_rules_come_first():
    from dataclasses import replace
    cfg = replace(rails_config(2), roce_rules=False)
    rules = policy.rules(cfg)
    assert [(r.priority, r.src, r.dst) for r in rules] == [
        (10100, "198.18.0.1/32", None), (10101, "198.18.1.1/32", None), (10199, None, "198.19.0.0/16")]


def test_decide_numbers_everything_from_the_allocation_not_from_positions():
    from dataclasses import replace
    cfg = rails_config(2)
    given = alloc.Allocation(
        rail_nexthops={"rail0": 1_000_150, "rail1": 1_000_120},
        group_nexthops={"fabric": alloc.GroupId(1_000_101, True, 16)},
        rule_priorities={"rail:rail0:roce": 10110, "rail:rail0:source": 10111,
                         "rail:rail1:roce": 10104, "rail:rail1:source": 10105,
                         "group:fabric": 10180},
        tables={"rail:rail0": 10140, "group:fabric": 10141})
    cfg = replace(cfg, auto_tables=frozenset({"rail:rail0", "group:fabric"}))
    d = policy.decide(cfg, ports(cfg), given)
    assert {(n.port, n.id) for n in d.desired.nexthops} == {("eth0", 1_000_150), ("eth1", 1_000_120)}
    (group,) = d.desired.groups
    assert (group.id, group.members) == (1_000_101, (1_000_120, 1_000_150))
    assert {(r.table, r.nhid) for r in d.desired.routes} == {
        (10140, 1_000_150), (10101, 1_000_120), (10141, 1_000_101)}
    assert sorted((r.priority, r.table) for r in d.desired.rules) == [
        (10104, 10101), (10105, 10101), (10110, 10140), (10111, 10140), (10180, 10141)]
    assert [r.table for r in d.rails] == [10140, 10101] and d.groups[0].table == 10141


verdicts = st.sampled_from([Verdict.UP, Verdict.DEGRADED, Verdict.DOWN])


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 4), min_paths=st.integers(1, 4),
       states=st.lists(st.tuples(verdicts, st.booleans()), min_size=4, max_size=4))
def test_group_and_tables_never_lose_a_path_that_a_port_could_carry(n, min_paths, states):
    cfg = rails_config(n, min_paths=min_paths)
    st_ = {f"eth{i}": port(f"eth{i}", v, carrier=(v is not Verdict.DOWN) or c)
           for i, (v, c) in enumerate(states[:n])}
    d = policy.decide(cfg, st_)
    with_carrier = [p for p, s in st_.items() if s.carrier]
    members = next(iter(d.desired.groups)).members if d.desired.groups else ()
    assert len(members) >= min(cfg.multipath[0].min_paths, len(with_carrier))
    if with_carrier:
        assert len(members) >= 1
        # every rail table has a route: all rails back each other up (ring)
        assert {r.table for r in d.desired.routes} >= {rail.table for rail in cfg.rails}
    nh_ids = {nh.id for nh in d.desired.nexthops}
    assert set(members) <= nh_ids
    for r in d.desired.routes:
        assert r.nhid in nh_ids | {g.id for g in d.desired.groups}
    up = [f"eth{i}" for i, (v, _) in enumerate(states[:n]) if v is Verdict.UP]
    if up:  # UP paths are always preferred over anything else
        nh_port = {nh.id: nh.port for nh in d.desired.nexthops}
        assert all(nh_port[r.nhid] in up for r in d.desired.routes if r.table != 10150)
        assert {nh_port[m] for m in members} >= set(up)


def test_decide_is_deterministic():
    cfg = rails_config(3)
    st_ = ports(cfg, eth1=port("eth1", Verdict.DOWN))
    assert policy.decide(cfg, st_) == policy.decide(cfg, dict(reversed(list(st_.items()))))


def probing_config(n=2):
    from dataclasses import replace as dc_replace

    from linkpassd.core.model import ProbeSettings

    cfg = rails_config(n)
    rails = tuple(dc_replace(r, probe_table=10160 + i, probe_peers=(f"198.18.{i}.77",))
                  for i, r in enumerate(cfg.rails))
    return dc_replace(cfg, rails=rails, probes=ProbeSettings(enabled=True, port=4793))


def probe_route_nh(decision, rail_index):
    routes = [r for r in decision.desired.routes if r.table == 10160 + rail_index]
    return [r.nhid for r in routes]


def test_probe_rules_come_first_and_pin_requests_and_replies_to_the_probe_table():
    cfg = probing_config(2)
    rules = sorted(policy.rules(cfg), key=lambda r: r.priority)
    for i in range(2):
        mine = [(r.table, r.ipproto, r.dport, r.sport) for r in rules if r.src == f"198.18.{i}.1/32"]
        assert mine == [(10160 + i, 17, 4793, None), (10160 + i, 17, None, 4793),
                        (10100 + i, 17, 4791, None), (10100 + i, None, None, None)]
    assert rules[-1].dst == "198.19.0.0/16"  # every rail rule before the multipath rule
    assert [r.priority for r in rules[:-1]] == list(range(10100, 10108))  # one slot per rail


def test_probe_table_keeps_the_rails_own_path_while_its_traffic_fails_over():
    cfg = probing_config(2)
    down_with_carrier = ports(cfg, eth0=port("eth0", Verdict.DOWN, carrier=True))
    d = policy.decide(cfg, down_with_carrier)
    assert route_nh(d, 10100) == nh(cfg, 1)  # traffic moved
    assert probe_route_nh(d, 0) == [nh(cfg, 0)]  # probes did not
    assert probe_route_nh(d, 1) == [nh(cfg, 1)]


def test_probe_table_is_empty_without_carrier_and_never_borrows_a_backup():
    cfg = probing_config(2)
    d = policy.decide(cfg, ports(cfg, eth0=port("eth0", Verdict.DOWN)))
    assert probe_route_nh(d, 0) == []
    assert route_nh(d, 10100) == nh(cfg, 1)


def test_no_probe_objects_while_probing_is_off():
    from dataclasses import replace as dc_replace

    from linkpassd.core.model import ProbeSettings

    cfg = dc_replace(probing_config(2), probes=ProbeSettings(enabled=False))
    d = policy.decide(cfg, ports(cfg))
    assert not {r for r in d.desired.routes if r.table in (10160, 10161)}
    assert not {r for r in d.desired.rules if r.table in (10160, 10161)}
    assert policy.rules(cfg) == policy.rules(rails_config(2))


def drained_ports(cfg, drained_at: dict[str, float]):
    """Port states as core.drain.apply makes them, each port drained at its time."""
    from linkpassd.core import drain
    wanted = {p: drain.request(p, "maintenance", "root (uid 0)", at, None,
                               tuple(r.port for r in cfg.rails)) for p, at in drained_at.items()}
    return drain.apply(ports(cfg), wanted)


def test_draining_the_backup_leaves_traffic_where_the_first_drain_moved_it():
    """Issue 28: drain eth0 (rail0 moves to eth1), then drain eth1 with no
    healthy port left: rail0 must stay on eth1, not go back to drained eth0."""
    cfg = rails_config(2)
    first = policy.decide(cfg, drained_ports(cfg, {"eth0": 100.0}))
    assert route_nh(first, 10100) == nh(cfg, 1)
    second = policy.decide(cfg, drained_ports(cfg, {"eth0": 100.0, "eth1": 200.0}))
    assert route_nh(second, 10100) == nh(cfg, 1)  # the earlier drain still holds
    assert route_nh(second, 10101) == nh(cfg, 1)
    # the other order: eth1 drained first, then eth0: everything stays on eth0
    other = policy.decide(cfg, drained_ports(cfg, {"eth1": 100.0, "eth0": 200.0}))
    assert route_nh(other, 10100) == nh(cfg, 0) and route_nh(other, 10101) == nh(cfg, 0)


def test_a_drained_port_stays_behind_undrained_ones_of_its_verdict():
    """The latest-drain-first order only swaps drained ports among
    themselves: an UP port still wins, and verdicts still rank first."""
    cfg = rails_config(3)
    st_ = drained_ports(cfg, {"eth0": 100.0, "eth1": 200.0})
    d = policy.decide(cfg, st_)
    assert route_nh(d, 10100) == nh(cfg, 2)  # eth2 is UP
    st_["eth2"] = port("eth2", Verdict.DOWN)
    d = policy.decide(cfg, st_)
    assert route_nh(d, 10100) == nh(cfg, 1) and route_nh(d, 10102) == nh(cfg, 1)
