"""Plan: ordered, make-before-break, idempotent — checked on a fake kernel
that follows the real kernel's semantics (core.plan.simulate)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corefixtures import port, ports, rails_config
from linkpassd.core import alloc, policy
from linkpassd.core import plan as planner
from linkpassd.core.model import KernelState, Nexthop, NexthopGroup, Op, OpKind, Route, Rule, Verdict
from linkpassd.core.plan import KernelSemanticsError, simulate, simulate_all

PROTO = 201


def converge(desired, observed):
    ops = planner.plan(desired, observed)
    return ops, simulate_all(observed, ops)


def test_from_empty_kernel_creates_in_dependency_order():
    cfg = rails_config(2)
    desired = policy.decide(cfg, ports(cfg)).desired
    ops, after = converge(desired, KernelState())
    kinds = [type(op.obj).__name__ for op in ops]
    assert kinds == ["Nexthop"] * 2 + ["NexthopGroup"] + ["Route"] * 3 + ["Rule"] * 5
    assert all(op.kind is OpKind.CREATE for op in ops)
    assert after == desired
    assert planner.plan(desired, after) == []


def test_failover_replaces_routes_in_place_then_deletes_dead_nexthop():
    cfg = rails_config(2)
    before = policy.decide(cfg, ports(cfg)).desired
    failed = policy.decide(cfg, ports(cfg, eth0=port("eth0", Verdict.DOWN, carrier=True))).desired
    # carrier still up (e.g. a verdict from a future probe): nexthop kept, tables move
    ops = planner.plan(failed, before)
    assert [(op.kind, type(op.obj).__name__) for op in ops] == [
        (OpKind.REPLACE, "NexthopGroup"), (OpKind.REPLACE, "Route")]
    assert simulate_all(before, ops) == failed


def test_after_kernel_flushed_dead_port_plan_recreates_routes_on_backup():
    cfg = rails_config(2)
    before = policy.decide(cfg, ports(cfg)).desired
    observed = planner.carrier_lost(before, "eth0")
    assert len(observed.routes) == 2  # the kernel flushed rail0's route
    desired = policy.decide(cfg, ports(cfg, eth0=port("eth0", Verdict.DOWN))).desired
    ops, after = converge(desired, observed)
    assert Op(OpKind.CREATE, Route(table=10100, dst="0.0.0.0/0", nhid=alloc.allocate(cfg, None).nexthop_id("rail1"),
                                   protocol=PROTO)) in ops
    assert after == desired


def test_resizing_a_resilient_group_is_make_before_break_under_a_fresh_id():
    """The kernel cannot resize a resilient group: the allocator gives the new
    shape a fresh id, so the new group is created, the route moved onto it,
    and only then the old group deleted. The route never goes missing."""
    small_cfg, big_cfg = rails_config(2, buckets=16), rails_config(2, buckets=32)
    small_alloc = alloc.allocate(small_cfg, None)
    small = policy.decide(small_cfg, ports(small_cfg), small_alloc).desired
    big_alloc = alloc.allocate(big_cfg, small_alloc, reserved_ids=alloc.kernel_ids(small))
    big = policy.decide(big_cfg, ports(big_cfg), big_alloc).desired
    old_id, new_id = small_alloc.group_id("fabric"), big_alloc.group_id("fabric")
    assert new_id != old_id
    ops = planner.plan(big, small)
    assert [(op.kind, type(op.obj).__name__, getattr(op.obj, "id", getattr(op.obj, "nhid", None)))
            for op in ops] == [(OpKind.CREATE, "NexthopGroup", new_id),
                               (OpKind.REPLACE, "Route", new_id),
                               (OpKind.DELETE, "NexthopGroup", old_id)]
    kernel = small
    for op in ops:
        kernel = simulate(kernel, op)
        assert any(r.dst == "198.19.0.0/16" for r in kernel.routes), f"{op} left no route"
    assert kernel == big and planner.plan(big, kernel) == []


def test_a_group_forced_to_change_shape_under_the_same_id_is_recreated():
    """The fallback when an id cannot be fresh (e.g. set by hand): delete first."""
    small = policy.decide(rails_config(2, buckets=16), ports(rails_config(2))).desired
    big = policy.decide(rails_config(2, buckets=32), ports(rails_config(2))).desired
    ops, after = converge(big, small)
    assert ops[0].kind is OpKind.DELETE and isinstance(ops[0].obj, NexthopGroup)
    assert after == big and planner.plan(big, after) == []


def test_id_changing_kind_is_deleted_first():
    observed = KernelState(nexthops=frozenset({Nexthop(5, "198.18.0.254", "eth0", PROTO)}))
    desired = KernelState(
        nexthops=frozenset({Nexthop(6, "198.18.0.254", "eth0", PROTO)}),
        groups=frozenset({NexthopGroup(5, (6,), PROTO)}))
    ops, after = converge(desired, observed)
    assert ops[0] == Op(OpKind.DELETE, Nexthop(5, "198.18.0.254", "eth0", PROTO))
    assert after == desired


def test_changed_rule_is_added_before_the_old_one_is_removed():
    old = Rule(priority=10100, table=10100, protocol=PROTO, src="198.18.0.1/32")
    new = Rule(priority=10100, table=10100, protocol=PROTO, src="198.18.0.2/32")
    ops = planner.plan(KernelState(rules=frozenset({new})), KernelState(rules=frozenset({old})))
    assert ops == [Op(OpKind.CREATE, new), Op(OpKind.DELETE, old)]


def test_fake_kernel_refuses_what_the_real_kernel_refuses():
    nh = Nexthop(1, "198.18.0.254", "eth0", PROTO)
    with pytest.raises(KernelSemanticsError):
        simulate(KernelState(), Op(OpKind.CREATE, NexthopGroup(2, (1,), PROTO)))
    with pytest.raises(KernelSemanticsError):
        simulate(KernelState(), Op(OpKind.CREATE, Route(10100, "0.0.0.0/0", 1, PROTO)))
    s = simulate(KernelState(), Op(OpKind.CREATE, nh))
    with pytest.raises(KernelSemanticsError):
        simulate(s, Op(OpKind.CREATE, nh))
    g = simulate(s, Op(OpKind.CREATE, NexthopGroup(2, (1,), PROTO, buckets=8)))
    with pytest.raises(KernelSemanticsError):
        simulate(g, Op(OpKind.REPLACE, NexthopGroup(2, (1,), PROTO, buckets=16)))
    with pytest.raises(KernelSemanticsError):
        simulate(KernelState(), Op(OpKind.REPLACE, Rule(1, 1, PROTO)))


# --------------------------------------------------------------------------
# Properties over random verdict histories and kernel side effects
# --------------------------------------------------------------------------

verdict_st = st.sampled_from([Verdict.UP, Verdict.DEGRADED, Verdict.DOWN])
step_st = st.tuples(st.lists(st.tuples(verdict_st, st.booleans()), min_size=4, max_size=4),
                    st.booleans())


def port_states(cfg, states):
    return {f"eth{i}": port(f"eth{i}", v, carrier=(v is not Verdict.DOWN) or c)
            for i, (v, c) in enumerate(states[:len(cfg.rails)])}


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 4), min_paths=st.integers(1, 3), steps=st.lists(step_st, min_size=1, max_size=8))
def test_plan_applies_cleanly_and_planning_again_yields_nothing(n, min_paths, steps):
    cfg = rails_config(n, min_paths=min_paths)
    kernel = KernelState()
    for states, kernel_acts_first in steps:
        ps = port_states(cfg, states)
        if kernel_acts_first:  # the kernel flushes dead ports before we decide
            for name, s in ps.items():
                if not s.carrier:
                    kernel = planner.carrier_lost(kernel, name)
        desired = policy.decide(cfg, ps).desired
        ops = planner.plan(desired, kernel)
        kernel = simulate_all(kernel, ops)  # raises if an op is one the kernel refuses
        assert kernel == desired
        assert planner.plan(desired, kernel) == []


@settings(max_examples=200, deadline=None)
@given(n=st.integers(2, 4), before=st.lists(st.tuples(verdict_st, st.booleans()), min_size=4, max_size=4),
       after=st.lists(st.tuples(verdict_st, st.booleans()), min_size=4, max_size=4))
def test_no_intermediate_step_leaves_a_kept_route_or_group_without_a_path(n, before, after):
    """Make-before-break: a route that exists before and after the plan exists,
    and resolves, at every step in between; a group never goes empty."""
    cfg = rails_config(n)
    kernel = policy.decide(cfg, port_states(cfg, before)).desired
    ps = port_states(cfg, after)
    for name, s in ps.items():
        if not s.carrier:
            kernel = planner.carrier_lost(kernel, name)
    desired = policy.decide(cfg, ps).desired
    kept = {r.key for r in kernel.routes} & {r.key for r in desired.routes}
    for op in planner.plan(desired, kernel):
        kernel = simulate(kernel, op)
        present = {r.key for r in kernel.routes}
        assert kept <= present, f"{op} removed a route that should have stayed"
        assert all(g.members for g in kernel.groups)
