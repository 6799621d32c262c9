"""Writes that do not depend on each other go to the kernel together
(core.apply.joins_wave): a failover's writes are in flight at once, and no
write is ever sent before what it needs has been acknowledged."""

from __future__ import annotations

import asyncio
import errno

from structlog.testing import capture_logs

from linkpassd.adapters.kernel import KernelOpError
from linkpassd.core import apply, plan
from linkpassd.core.model import KernelState, Nexthop, NexthopGroup, Op, OpKind, Route, Rule
from test_daemon_faults import (
    FakeKernel,
    converge,
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
    """NH1's only user is the route: the delete is refused before the move
    and valid only after it, so it waits for the move's answer."""
    only_route = KernelState(nexthops=frozenset({NH1, NH2}), routes=frozenset({ROUTE}))
    move = Op(OpKind.REPLACE, Route(table=10100, dst="0.0.0.0/0", nhid=12, protocol=201))
    assert wave_of([move, Op(OpKind.DELETE, NH1)], only_route) == [move]


def test_a_delete_valid_before_the_wave_but_not_after_it_waits():
    lone = KernelState(nexthops=frozenset({NH1, NH2}))
    route_to_nh2 = Op(OpKind.CREATE, Route(table=10100, dst="0.0.0.0/0", nhid=12, protocol=201))
    assert wave_of([route_to_nh2, Op(OpKind.DELETE, NH2)], lone) == [route_to_nh2]


def test_two_writes_of_one_object_never_share_a_wave():
    """Both replaces are valid before and after either: only their one
    object keeps them apart."""
    first = Op(OpKind.REPLACE, Route(table=10100, dst="0.0.0.0/0", nhid=12, protocol=201))
    again = Op(OpKind.REPLACE, Route(table=10100, dst="0.0.0.0/0", nhid=11, protocol=201))
    assert wave_of([first, again]) == [first]


def test_a_write_never_goes_beside_a_write_of_what_it_refers_to():
    """A route moved onto a group whose members change waits for the group
    (groups before routes), though it is valid either way."""
    reshape = Op(OpKind.REPLACE, NexthopGroup(id=20, members=(12,), protocol=201))
    onto_group = Op(OpKind.REPLACE, Route(table=10100, dst="0.0.0.0/0", nhid=20, protocol=201))
    assert wave_of([reshape, onto_group]) == [reshape]
    regateway = Op(OpKind.REPLACE, Nexthop(id=12, gateway="198.18.1.253", port="eth1",
                                           protocol=201))
    assert wave_of([regateway, reshape]) == [regateway]  # a member rewritten: the group waits


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


def test_writes_of_one_table_keep_the_plans_order():
    """A rule waits for its table's routes, a route for the removal of the
    rule that sends traffic to its table, and a table's new route for its
    stale one's removal; other tables' writes go together."""
    route = Route(table=10100, dst="0.0.0.0/0", nhid=11, protocol=201)
    rule = Rule(priority=100, table=10100, protocol=201, src="198.18.0.1/32")
    other = Rule(priority=101, table=10101, protocol=201, src="198.18.1.1/32")
    fresh = KernelState(nexthops=frozenset({NH1, NH2}))
    made = [Op(OpKind.CREATE, route), Op(OpKind.CREATE, other), Op(OpKind.CREATE, rule)]
    assert wave_of(made, fresh) == made[:2]
    held = KernelState(nexthops=fresh.nexthops, routes=frozenset({route}),
                       rules=frozenset({rule}))
    gone = [Op(OpKind.DELETE, rule), Op(OpKind.DELETE, route)]
    assert wave_of(gone, held) == gone[:1]
    moved_rule = Rule(priority=102, table=10100, protocol=201, src="198.18.0.1/32")
    assert wave_of([Op(OpKind.CREATE, moved_rule), Op(OpKind.DELETE, rule)], held) \
        == [Op(OpKind.CREATE, moved_rule)]
    narrower = Route(table=10100, dst="198.18.0.0/16", nhid=12, protocol=201)
    assert wave_of([Op(OpKind.CREATE, narrower), Op(OpKind.DELETE, route)], held) \
        == [Op(OpKind.CREATE, narrower)]


def test_an_unexpected_error_in_a_wave_takes_every_answer_before_the_pass_fails(tmp_path):
    """The group's write raises a bug; the route's write, sent with it, was
    taken by the kernel and is logged as such; the pass fails, and the next
    one re-reads and converges."""
    daemon, clock, kernel = waved(tmp_path)
    kernel.unexpected = lambda op, n: isinstance(op.obj, NexthopGroup)
    with capture_logs() as logs:
        clock.t += 0.5
        run(daemon.handle([drain_cmd("eth0")]))
    assert daemon.reconcile_failures == 1 and "injected bug" in daemon.last_error
    table0 = daemon.config.rails[0].table
    written = [e["detail"] for e in logs if e["event"] == "kernel_write"]
    assert any(f"table={table0}" in d for d in written), written
    assert not any("NexthopGroup" in d for d in written), written
    kernel.unexpected = lambda op, n: False
    run(converge(daemon, clock))
    assert kernel.state == desired_now(daemon) and daemon.last_error == ""


def test_writes_of_a_wave_that_time_out_renew_the_socket_once(tmp_path):
    """Both writes of a failover time out (a kernel stuck on its lock): one
    new socket for the wave, both writes remembered for their retry."""
    daemon, clock, kernel = waved(tmp_path)
    timed_out = lambda op, n: KernelOpError(op, errno.ETIMEDOUT, "no answer")  # noqa: E731
    kernel.refuse = lambda op, n: True
    kernel.refusal = timed_out
    clock.t += 0.5
    cmd = drain_cmd("eth0")
    run(daemon.handle([cmd]))
    assert "routes have not moved yet" in str(cmd.done.exception())  # the operator is told
    assert kernel.sockets_replaced == 1
    assert {type(f.op.obj) for f in daemon.failures.values()} == {NexthopGroup, Route}
    kernel.refuse = lambda op, n: False
    run(converge(daemon, clock))
    assert kernel.state == desired_now(daemon)
