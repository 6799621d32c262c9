"""The probe mesh planner (aggregator/mesh.py): its rules, checked on many
generated fleets (hypothesis) and on one of the size the issue names."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from linkpassd._proto.linkpass.v1 import fleet_pb2
from linkpassd.aggregator.mesh import Member, in_degree_bound, members_from_inventory, plan, probe_peers, probers

Edge = tuple[str, str, str]  # (prober host, rail, target address)


def fleet(hosts: int, rails: int, per_leaf: int | None, skip: frozenset[int] = frozenset(),
          leafless: frozenset[int] = frozenset()) -> list[Member]:
    """Host h's rail r address is 10.r.(h // 256).(h % 256); leaves group
    `per_leaf` consecutive hosts (None: no host has a leaf)."""
    return [
        Member(f"h{h:05d}", f"rail{r}", f"10.{r}.{h // 256}.{h % 256}",
               "" if per_leaf is None or h in leafless else f"leaf{h // per_leaf}")
        for h in range(hosts) if h not in skip for r in range(rails)
    ]


def edges(p: dict[str, dict[str, tuple[str, ...]]]) -> set[Edge]:
    return {(h, rail, a) for h, rails in p.items() for rail, peers in rails.items() for a in peers}


@st.composite
def fleets(draw: st.DrawFn) -> tuple[list[Member], int, int]:
    """Up to 40 hosts, 1-3 rails (a host may lack some), leaves of mixed
    sizes, some hosts without a leaf; k and max drawn too."""
    n = draw(st.integers(1, 40))
    rail_names = [f"rail{r}" for r in range(draw(st.integers(1, 3)))]
    leaf_names = [f"L{i}" for i in range(draw(st.integers(1, 6)))]
    members = []
    for h in range(n):
        leaf = draw(st.sampled_from([*leaf_names, ""]))
        for r, rail in enumerate(rail_names):
            if draw(st.integers(0, 9)) == 0:  # this host lacks this rail
                continue
            members.append(Member(f"host-{h}", rail, f"10.{r}.0.{h}", leaf))
    k = draw(st.integers(0, 4))
    return members, k, k + draw(st.integers(0, 4))


def leaf_key(m: Member) -> str:
    return m.leaf or f"host:{m.host_id}"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets(), st.randoms(use_true_random=False))
def test_same_members_in_any_order_give_the_same_plan(case, rnd) -> None:
    members, k, max_peers = case
    shuffled = list(members)
    rnd.shuffle(shuffled)
    assert plan(shuffled, peers_per_rail=k, max_peers_per_rail=max_peers) == plan(
        members, peers_per_rail=k, max_peers_per_rail=max_peers)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets())
def test_every_plan_keeps_the_rules(case) -> None:
    """No self-probe; only same-rail peers; other leaves first; out-degree
    <= max; in-degree <= 2k + coverage room; k peers whenever possible."""
    members, k, max_peers = case
    p = plan(members, peers_per_rail=k, max_peers_per_rail=max_peers)
    by_rail_addr = {(m.rail, m.address): m for m in members}
    assert set(p) == {m.host_id for m in members}
    in_deg = Counter((rail, a) for rails in p.values() for rail, peers in rails.items() for a in peers)
    assert max(in_deg.values(), default=0) <= in_degree_bound(k, max_peers)
    for m in members:
        peers = p[m.host_id][m.rail]
        assert len(peers) <= max_peers
        assert m.address not in peers
        rail_members = [o for o in members if o.rail == m.rail and o.host_id != m.host_id]
        assert len(peers) >= min(k, len(rail_members)), (m, peers)
        for a in peers:
            peer = by_rail_addr[(m.rail, a)]  # KeyError: a peer that is no member of this rail
            assert peer.host_id != m.host_id
        # A same-leaf peer only when the rail has one leaf, or every host
        # under another leaf is a peer already or was full (2k base probes).
        if any(leaf_key(by_rail_addr[(m.rail, a)]) == leaf_key(m) for a in peers):
            others = [o for o in rail_members if leaf_key(o) != leaf_key(m)]
            assert all(o.address in peers or in_deg[(m.rail, o.address)] >= 2 * k for o in others), (m, peers)


def rail_leaves(members: list[Member], rail: str) -> dict[str, list[Member]]:
    out: dict[str, list[Member]] = {}
    for m in members:
        if m.rail == rail and m.leaf:
            out.setdefault(m.leaf, []).append(m)
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(2, 12), st.integers(1, 3), st.integers(1, 5), st.data())
def test_every_ordered_leaf_pair_is_covered_when_hosts_allow(leaf_count, k, extra, data) -> None:
    """Coverage is possible when every leaf has at least (leaves-1)/(max-k)
    hosts: that much room for the probes the coverage pass adds from it, and
    to it."""
    max_peers = k + extra
    need = -(-(leaf_count - 1) // extra)
    sizes = [data.draw(st.integers(need, need + 4)) for _ in range(leaf_count)]
    members = []
    h = 0
    for leaf, size in enumerate(sizes):
        for _ in range(size):
            members += [Member(f"h{h}", rail, f"10.{r}.{h // 256}.{h % 256}", f"L{leaf}")
                        for r, rail in enumerate(["rail0", "rail1"])]
            h += 1
    p = plan(members, peers_per_rail=k, max_peers_per_rail=max_peers)
    for rail in ("rail0", "rail1"):
        leaf_of_addr = {m.address: m.leaf for m in members if m.rail == rail}
        covered = {(m.leaf, leaf_of_addr[a]) for m in members if m.rail == rail for a in p[m.host_id][rail]}
        wanted = {(a, b) for a in map(str, range(leaf_count)) for b in map(str, range(leaf_count)) if a != b}
        assert {(f"L{a}", f"L{b}") for a, b in wanted} <= covered


def test_a_single_leaf_probes_within_it_and_one_host_probes_nobody() -> None:
    members = [Member(f"h{i}", "rail0", f"10.0.0.{i}", "only") for i in range(6)]
    p = plan(members, peers_per_rail=3, max_peers_per_rail=8)
    assert all(len(p[f"h{i}"]["rail0"]) == 3 for i in range(6))
    assert plan(members[:1], peers_per_rail=3, max_peers_per_rail=8) == {"h0": {"rail0": ()}}
    assert plan([], peers_per_rail=3, max_peers_per_rail=8) == {}


def test_a_small_leaf_next_to_a_big_one_is_not_swamped() -> None:
    """100 hosts under leaf A, 2 under leaf B: B can take only 2 x 2k base
    probes (+ coverage room); the rest of A probe within A rather than
    probing nobody or piling onto B."""
    members = [Member(f"a{i}", "rail0", f"10.0.0.{i}", "A") for i in range(100)]
    members += [Member(f"b{i}", "rail0", f"10.0.1.{i}", "B") for i in range(2)]
    k, max_peers = 3, 8
    p = plan(members, peers_per_rail=k, max_peers_per_rail=max_peers)
    in_deg = Counter(a for rails in p.values() for a in rails["rail0"])
    assert in_deg["10.0.1.0"] <= in_degree_bound(k, max_peers)
    assert in_deg["10.0.1.1"] <= in_degree_bound(k, max_peers)
    assert all(len(p[f"a{i}"]["rail0"]) == k for i in range(100))
    assert all(set(p[f"b{i}"]["rail0"]) <= {f"10.0.0.{j}" for j in range(100)} for i in range(2))


def test_bad_bounds_are_refused_with_their_values() -> None:
    with pytest.raises(ValueError, match=r"max_peers_per_rail \(2\).*peers_per_rail \(3\)"):
        plan([], peers_per_rail=3, max_peers_per_rail=2)
    with pytest.raises(ValueError, match="peers_per_rail must be >= 0, not -1"):
        plan([], peers_per_rail=-1, max_peers_per_rail=2)


def test_a_host_listed_twice_on_a_rail_is_planned_once_whatever_the_order() -> None:
    members = [Member("h0", "rail0", "10.0.0.9", "A"), Member("h0", "rail0", "10.0.0.1", "A"),
               Member("h1", "rail0", "10.0.0.2", "B")]
    for order in (members, members[::-1]):
        assert plan(order, peers_per_rail=1, max_peers_per_rail=2) == {
            "h0": {"rail0": ("10.0.0.2",)}, "h1": {"rail0": ("10.0.0.1",)}}


def changed_probes(before: set[Edge], after: set[Edge], host: str, addresses: set[str]) -> int:
    """Probes that moved, ignoring those of the host that joined or left and
    those aimed at it (they must change)."""
    def keep(edges_: set[Edge]) -> set[Edge]:
        return {e for e in edges_ if e[0] != host and e[2] not in addresses}
    return len(keep(before) ^ keep(after))


@pytest.mark.parametrize("per_leaf", [10, 20, None])
def test_a_join_or_leave_moves_few_probes(per_leaf) -> None:
    """200 hosts x 2 rails, k = 3 (1,200 base probes); every 4th host leaves
    in turn (a join is the same comparison the other way round). Counted:
    the other probe edges that change (symmetric difference); ~6 must (the
    probes aimed at the host). Measured: worst 31 / 21 / 17 and mean 14 / 9 / 8
    for leaves of 10 / 20 / none. With one ring point per host instead of 8
    it was worst 77 / 50 / 62, mean 29 / 20 / 23: hosts after long arcs hit
    the in-degree bound and deflected probes down the ring on every re-plan."""
    k, max_peers = 3, 8
    full = edges(plan(fleet(200, 2, per_leaf), peers_per_rail=k, max_peers_per_rail=max_peers))
    assert len(full) >= 1200
    changes = []
    for who in range(0, 200, 4):
        without = edges(plan(fleet(200, 2, per_leaf, skip=frozenset({who})), peers_per_rail=k,
                             max_peers_per_rail=max_peers))
        changes.append(changed_probes(full, without, f"h{who:05d}", {f"10.{r}.0.{who}" for r in range(2)}))
    assert max(changes) <= 45, changes
    assert sum(changes) / len(changes) <= 18, changes


def test_the_issue_sized_fleet_plans_in_bounded_time() -> None:
    """2,048 hosts x 8 rails, leaves of 32 (64 leaves per rail): bounded
    time (not a benchmark: < 10 s on a busy 2-core machine; measured ~0.5 s),
    every ordered leaf pair of every rail covered, the bounds kept."""
    members = fleet(2048, 8, 32)
    started = time.perf_counter()
    p = plan(members, peers_per_rail=3, max_peers_per_rail=8)
    elapsed = time.perf_counter() - started
    assert elapsed < 10, elapsed
    e = edges(p)
    out_deg = Counter((h, r) for h, r, _ in e)
    in_deg = Counter((r, a) for _, r, a in e)
    assert min(out_deg.values()) >= 3 and max(out_deg.values()) <= 8
    assert max(in_deg.values()) <= in_degree_bound(3, 8)
    for r in range(8):
        covered = {(h // 32, int(a.split(".")[2]) * 256 // 32 + int(a.split(".")[3]) // 32)
                   for h in range(2048) for a in p[f"h{h:05d}"][f"rail{r}"]}
        assert len(covered) == 64 * 63


def test_inventory_addresses_lose_their_prefix_and_bad_rails_are_left_out() -> None:
    inv = fleet_pb2.Inventory(rails=[
        fleet_pb2.RailInventory(rail="rail0", port="eth1", address="198.18.0.1/24", leaf="L1"),
        fleet_pb2.RailInventory(rail="rail1", port="eth2", address="not-an-address"),
        fleet_pb2.RailInventory(rail="rail2", port="eth3", address=""),
        fleet_pb2.RailInventory(rail="", port="eth4", address="198.18.4.1/24"),
        fleet_pb2.RailInventory(rail="rail5", port="eth5", address="2001:db8::5/64"),
    ])
    assert members_from_inventory("h1", inv) == [
        Member("h1", "rail0", "198.18.0.1", "L1"), Member("h1", "rail5", "2001:db8::5", "")]


def test_probe_peers_message_lists_rails_by_name() -> None:
    msg = probe_peers({"rail1": ("10.1.0.2",), "rail0": ("10.0.0.2", "10.0.0.3")}, generation=7)
    assert msg.generation == 7
    assert [(r.rail, list(r.peers)) for r in msg.rails] == [
        ("rail0", ["10.0.0.2", "10.0.0.3"]), ("rail1", ["10.1.0.2"])]


def test_probers_turn_the_plan_around_so_every_probed_host_knows_whom_to_answer():
    members = [Member(f"h{i}", rail, f"198.{18 + r}.0.{i + 1}", leaf=f"leaf{i % 3}")
               for i in range(9) for r, rail in enumerate(("rail0", "rail1"))]
    planned = plan(members, peers_per_rail=2, max_peers_per_rail=4)
    turned = probers(planned, members)
    address = {(m.host_id, m.rail): m.address for m in members}
    host_at = {(m.rail, m.address): m.host_id for m in members}
    edges = {(host, rail, peer) for host, rails in planned.items()
             for rail, peers in rails.items() for peer in peers}
    back = {(host_at[(rail, src)], rail, address[(target, rail)])
            for target, rails in turned.items() for rail, srcs in rails.items() for src in srcs}
    assert edges and back == edges  # every probe has its answerer, and nothing else is admitted
    message = probe_peers(planned["h0"], 3, turned.get("h0", {}))
    assert {r.rail: list(r.probed_by) for r in message.rails} == \
        {rail: list(turned.get("h0", {}).get(rail, ())) for rail in planned["h0"]}
