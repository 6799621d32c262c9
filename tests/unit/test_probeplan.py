"""The validation probe plan (linkpassd/validate/probeplan.py): every pair
under a leaf probes once, every leaf pair of a rail is covered, every host
probes across leaves, the plan is deterministic and its size is the formula."""

import itertools
import random
from collections import Counter

import pytest

from linkpassd.validate.probeplan import Member, ProbePlan, expected_size


def fabric(leaf_sizes, rails=("rail0", "rail1")):
    members = []
    for rail in rails:
        host = 0
        for leaf, size in enumerate(leaf_sizes):
            for _ in range(size):
                members.append(Member(host=f"h{host:03d}", rail=rail, address=f"10.{rails.index(rail)}.0.{host}",
                                      leaf=f"{rail}-leaf{leaf}"))
                host += 1
    return members


SHAPES = [(4, 4), (5, 3, 1), (32,), (7, 7, 7, 7, 7), (2, 9, 4, 1, 6), (16,) * 12]


def unordered(probe):
    return frozenset((probe.sender, probe.receiver))


@pytest.mark.parametrize("sizes", SHAPES)
def test_every_pair_under_a_leaf_probes_exactly_once(sizes):
    members = fabric(sizes)
    plan = ProbePlan.build(members)
    for rail in ("rail0", "rail1"):
        leaves = {}
        for m in members:
            if m.rail == rail:
                leaves.setdefault(m.leaf, []).append(m.host)
        intra = Counter(unordered(p) for p in plan.probes if p.rail == rail and not p.cross_leaf)
        wanted = {frozenset(pair) for hosts in leaves.values() for pair in itertools.combinations(hosts, 2)}
        assert set(intra) == wanted
        assert all(count == 1 for count in intra.values())


@pytest.mark.parametrize("sizes", SHAPES)
def test_every_leaf_pair_is_covered_and_every_host_probes_across_leaves(sizes):
    plan = ProbePlan.build(fabric(sizes), cross_per_leaf_pair=2, cross_per_host=2)
    for rail in ("rail0", "rail1"):
        leaves = sorted({f"{rail}-leaf{i}" for i in range(len(sizes))})
        cross = [p for p in plan.probes if p.rail == rail and p.cross_leaf]
        per_leaf_pair = Counter(frozenset((p.sender_leaf, p.receiver_leaf)) for p in cross)
        for a, b in itertools.combinations(leaves, 2):
            size_a, size_b = sizes[leaves.index(a)], sizes[leaves.index(b)]
            assert per_leaf_pair[frozenset((a, b))] >= min(2, size_a * size_b), (a, b)
        assert len({unordered(p) for p in cross}) == len(cross), "a cross-leaf pair twice"
        if len(sizes) > 1:
            per_host = Counter(h for p in cross for h in (p.sender, p.receiver))
            for m in fabric(sizes):
                if m.rail == rail:
                    others = sum(sizes) - sizes[leaves.index(m.leaf)]
                    assert per_host[m.host] >= min(2, others), m.host


def test_sending_alternates_so_every_host_sends_about_half_of_its_leaf():
    plan = ProbePlan.build(fabric((7, 8), rails=("rail0",)), cross_per_leaf_pair=1, cross_per_host=0)
    sent = Counter(p.sender for p in plan.probes if not p.cross_leaf)
    leaf7 = [sent[f"h{i:03d}"] for i in range(7)]
    leaf8 = [sent[f"h{i:03d}"] for i in range(7, 15)]
    assert leaf7 == [3] * 7  # (7-1)/2
    assert sorted(leaf8) == [3] * 4 + [4] * 4  # 7 pairs each, the opposite host to one side


@pytest.mark.parametrize("sizes", SHAPES)
def test_the_size_is_the_formula(sizes):
    for per_leaf_pair, per_host in ((1, 0), (2, 2), (3, 5)):
        plan = ProbePlan.build(fabric(sizes), cross_per_leaf_pair=per_leaf_pair, cross_per_host=per_host)
        assert plan.size == expected_size({"rail0": sizes, "rail1": sizes},
                                          cross_per_leaf_pair=per_leaf_pair, cross_per_host=per_host)


def test_size_by_hand_for_the_test_fabric():
    # 2 leaves of 4: 2 x 6 intra; one leaf pair: max(2, ceil(2*4/1)) = 8 cross; per rail 20.
    assert ProbePlan.build(fabric((4, 4))).counts() == {"rail0": {"intra": 12, "cross": 8},
                                                        "rail1": {"intra": 12, "cross": 8}}


def test_deterministic_whatever_the_order_of_members():
    members = fabric((5, 3, 6))
    first = ProbePlan.build(members)
    shuffled = list(members)
    random.Random(7).shuffle(shuffled)
    again = ProbePlan.build(shuffled)
    assert again.probes == first.probes
    assert again.targets_for("h002") == first.targets_for("h002")


def test_targets_and_probers_mirror_each_other_with_addresses():
    plan = ProbePlan.build(fabric((3, 3)))
    sent = {(h, t.rail, t.peer_host) for h in (f"h{i:03d}" for i in range(6)) for t in plan.targets_for(h)}
    answered = {(t.peer_host, t.rail, h) for h in (f"h{i:03d}" for i in range(6)) for t in plan.probers_of(h)}
    assert sent == answered == {(p.sender, p.rail, p.receiver) for p in plan.probes}
    target = plan.targets_for("h000")[0]
    assert target.peer == f"10.{0 if target.rail == 'rail0' else 1}.0.{int(target.peer_host[1:])}"
    assert target.to_proto().peer_host == target.peer_host
    assert plan.targets_for("nobody") == []


def test_hosts_without_a_leaf_are_leaves_of_their_own_and_a_single_leaf_has_no_cross_pairs():
    members = [Member(f"h{i}", "rail0", f"10.0.0.{i}") for i in range(4)]
    plan = ProbePlan.build(members)
    assert all(p.cross_leaf for p in plan.probes)
    assert {unordered(p) for p in plan.probes} == {frozenset(x) for x in itertools.combinations(
        [f"h{i}" for i in range(4)], 2)}
    single = ProbePlan.build([Member(f"h{i}", "rail0", leaf="L") for i in range(5)])
    assert single.size == 10 and not any(p.cross_leaf for p in single.probes)


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="cross_per_leaf_pair must be >= 1"):
        ProbePlan.build(fabric((2, 2)), cross_per_leaf_pair=0)
    with pytest.raises(ValueError, match="cross_per_host must be >= 0"):
        ProbePlan.build(fabric((2, 2)), cross_per_host=-1)
