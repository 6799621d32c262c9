"""Writes that do not depend on each other go to the kernel together
(core.apply.joins_wave): a failover's writes are in flight at once, and no
write is ever sent before what it needs has been acknowledged."""

from __future__ import annotations

import asyncio

from linkpassd.core import apply, plan
from linkpassd.core.model import KernelState, Nexthop, NexthopGroup, Op, OpKind, Route, Rule
from test_daemon_faults import (
    FakeKernel,
    converged,
    desired_now,
    make,
    pull_cable,
    restore_cable,
    run,
    start,
)
from test_daemon_ops import drain_cmd

NOW = 100.0
NH1 = Nexthop(id=11, gateway="198.18.0.254", port="eth0", protocol=201)
NH2 = Nexthop(id=12, gateway="198.18.1.254", port="eth1", protocol=201)
GROUP = NexthopGroup(id=20, members=(11, 12), protocol=201)
ROUTE = Route(table=10100, dst="0.0.0.0/0", nhid=11, protocol=201)
BASE = KernelState(nexthops=frozenset({NH1, NH2}), groups=frozenset({GROUP}),
                   routes=frozenset({ROUTE}))


def wave_of(ops: list[Op], view: KernelState = BASE) -> list[Op]:
    """The first wave: ops taken in order while each joins the ones before."""
    wave: list[Op] = [ops[0]]
    after = plan.simulate(view, ops[0])
    for op in ops[1:]:
        if not apply.joins_wave(op, view, wave, after, NOW):
            break
        wave.append(op)
        after = plan.simulate(after, op)
    return wave


def test_a_failovers_group_and_route_writes_join_one_wave():
    shrink = Op(OpKind.REPLACE, NexthopGroup(id=20, members=(12,), protocol=201))
    move = Op(OpKind.REPLACE, Route(table=10100, dst="0.0.0.0/0", nhid=12, protocol=201))
    assert wave_of([shrink, move]) == [shrink, move]


def test_a_write_that_needs_an_object_of_the_wave_waits_for_its_answer():
    new_nh = Nexthop(id=13, gateway="198.18.2.254", port="eth2", protocol=201)
    create = Op(OpKind.CREATE, new_nh)
    grow = Op(OpKind.REPLACE, NexthopGroup(id=20, members=(11, 12, 13), protocol=201))
    assert wave_of([create, grow]) == [create]


def test_a_delete_waits_until_the_route_that_used_it_has_moved():
    move = Op(OpKind.REPLACE, Route(table=10100, dst="0.0.0.0/0", nhid=12, protocol=201))
    drop = Op(OpKind.DELETE, NH1)  # still in GROUP: blocked before and after the move
    drop_group_member = Op(OpKind.REPLACE, NexthopGroup(id=20, members=(12,), protocol=201))
    assert wave_of([move, drop]) == [move]
    # valid before the wave (no user) but not after it (the route now uses it)
    lone = KernelState(nexthops=frozenset({NH1, NH2}))
    route_to_nh2 = Op(OpKind.CREATE, Route(table=10100, dst="0.0.0.0/0", nhid=12, protocol=201))
    assert wave_of([route_to_nh2, Op(OpKind.DELETE, NH2)], lone) == [route_to_nh2]
    assert wave_of([drop_group_member, move]) == [drop_group_member, move]


def test_two_writes_of_one_object_never_share_a_wave():
    first = Op(OpKind.REPLACE, Route(table=10100, dst="0.0.0.0/0", nhid=12, protocol=201))
    again = Op(OpKind.REPLACE, Route(table=10100, dst="0.0.0.0/0", nhid=11, protocol=201))
    assert wave_of([first, again]) == [first]
    rule = Rule(priority=100, table=10100, protocol=201, src="198.18.0.1/32")
    assert wave_of([Op(OpKind.CREATE, rule), Op(OpKind.DELETE, rule)],
                   KernelState()) == [Op(OpKind.CREATE, rule)]


class WaveKernel(FakeKernel):
    """Answers a write only after every write sent with it has been sent,
    and records what was in flight together and any write sent before what
    it needs was in the kernel (a real kernel would refuse it)."""

    def __init__(self, state: KernelState = KernelState()):
        super().__init__(state)
        self.in_flight: list[Op] = []
        self.together: list[tuple[Op, ...]] = []  # in flight when each was answered
        self.too_early: list[tuple[Op, str]] = []

    async def apply(self, op: Op) -> None:
        try:
            plan.simulate(self.state, op)
        except plan.KernelSemanticsError as exc:
            self.too_early.append((op, str(exc)))
        self.in_flight.append(op)
        await asyncio.sleep(0)  # the daemon may send more before this is answered
        self.together.append(tuple(self.in_flight))
        self.in_flight.remove(op)
        await super().apply(op)


def waved(tmp_path):
    daemon, clock, kernel = converged(tmp_path)
    wk = WaveKernel(kernel.state)
    daemon.kernel = wk
    return daemon, clock, wk


def test_a_failovers_writes_are_in_flight_together(tmp_path):
    """Traffic leaves eth0 with its carrier up (as on an echo or BFD
    verdict; here a drain): rail0's table moves and the fabric group
    shrinks, in one wave."""
    daemon, clock, kernel = waved(tmp_path)
    clock.t += 0.5
    run(daemon.handle([drain_cmd("eth0")]))
    assert kernel.state == desired_now(daemon)
    table0 = daemon.config.rails[0].table
    moved = next(o for o in {op for t in kernel.together for op in t}
                 if isinstance(o.obj, Route) and o.obj.table == table0)
    with_it = next(t for t in kernel.together if moved in t)
    assert any(isinstance(o.obj, NexthopGroup) for o in with_it), \
        f"rail0's route and the group it left were not sent together: {kernel.together}"
    assert kernel.too_early == []


def test_no_write_goes_before_what_it_needs_at_start_and_on_failback(tmp_path):
    kernel = WaveKernel()
    daemon, clock = make(tmp_path, kernel)
    start(daemon, ["eth0", "eth1", "eth2"])
    assert kernel.state == desired_now(daemon)
    assert kernel.too_early == []
    assert max(len(t) for t in kernel.together) > 1  # independent writes did go together
    pull_cable(daemon, clock, kernel, "eth0")
    restore_cable(daemon, clock, "eth0")  # nexthop re-created, then the group and route use it
    assert kernel.state == desired_now(daemon)
    assert kernel.too_early == []


def test_a_rule_waits_for_the_routes_of_its_table_and_they_for_its_removal():
    route = Route(table=10100, dst="0.0.0.0/0", nhid=11, protocol=201)
    rule = Rule(priority=100, table=10100, protocol=201, src="198.18.0.1/32")
    other = Rule(priority=101, table=10101, protocol=201, src="198.18.1.1/32")
    fresh = KernelState(nexthops=frozenset({NH1, NH2}))
    made = [Op(OpKind.CREATE, route), Op(OpKind.CREATE, other), Op(OpKind.CREATE, rule)]
    assert wave_of(made, fresh) == made[:2]  # another table's rule may go with the route
    gone = [Op(OpKind.DELETE, rule), Op(OpKind.DELETE, route)]
    assert wave_of(gone, KernelState(nexthops=fresh.nexthops, routes=frozenset({route}),
                                     rules=frozenset({rule}))) == gone[:1]
