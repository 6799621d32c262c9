"""The daemon's reconcile against a fake kernel (no root), with failures
injected at every step: whatever the kernel refuses, the kernel is left
consistent, no route the host could have kept is lost, unrelated changes go
ahead, nothing ends the daemon, and everything converges once the failure
clears.

The fake kernel is core.plan's statement of the kernel's semantics
(`simulate`), so a write it accepts is one the real kernel would accept."""

from __future__ import annotations

import asyncio
import dataclasses
import errno

import pytest

from corefixtures import rails_config
from linkpassd.adapters.kernel import KernelOpError, KernelSocketError, Observation
from linkpassd.adapters.links import LinkEvent, LinkSnapshot
from linkpassd.core import plan
from linkpassd.core.model import KernelState, LinkSample, Op, Verdict
from linkpassd.daemon.loop import Daemon, Tick


class FakeKernel:
    """Holds a KernelState; `refuse(op, n)` decides whether the n-th write fails."""

    def __init__(self, state: KernelState = KernelState()):
        self.state = state
        self.writes = 0
        self.attempts = 0
        self.refuse = lambda op, n: False
        self.refusal = lambda op, n: KernelOpError(op, errno.EEXIST, "injected refusal")
        self.unexpected = lambda op, n: False
        self.observe_fails = False
        self.socket_broken = False  # like pyroute2: a failed socket fails every use
        self.sockets_replaced = 0
        self.ipr = None
        self.foreign: tuple = ()

    async def observe(self, ownership) -> KernelState:
        if self.observe_fails:
            raise OSError(errno.EIO, "injected: netlink dump failed")
        if self.socket_broken:
            raise KernelSocketError("link dump: netlink socket failed: [Errno 22] Invalid argument",
                                    errno.EINVAL)
        return self.state

    async def observe_with_foreign(self, ownership) -> Observation:
        return Observation(await self.observe(ownership), self.foreign)

    def replace_socket(self, ipr):
        self.sockets_replaced += 1
        self.socket_broken = False
        old, self.ipr = self.ipr, ipr
        return old if old is not None else ipr

    async def apply(self, op: Op) -> None:
        self.attempts += 1
        if self.unexpected(op, self.attempts):
            raise RuntimeError(f"injected bug while writing {op}")
        if self.refuse(op, self.attempts):
            raise self.refusal(op, self.attempts)
        try:
            self.state = plan.simulate(self.state, op)
        except plan.KernelSemanticsError as exc:
            raise KernelOpError(op, errno.EINVAL, str(exc)) from exc
        self.writes += 1


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def link(port: str, carrier: bool = True) -> LinkSample:
    return LinkSample(port=port, present=True, ifindex=int(port[-1]) + 2, admin_up=True,
                      carrier=carrier, operstate="UP" if carrier else "LOWERLAYERDOWN")


def consistent(state: KernelState) -> None:
    ids = {n.id for n in state.nexthops} | {g.id for g in state.groups}
    nh_ids = {n.id for n in state.nexthops}
    for route in state.routes:
        assert route.nhid in ids, f"{route} points at nothing"
    for group in state.groups:
        assert group.members and set(group.members) <= nh_ids, f"{group} has missing members"


def make(tmp_path, kernel: FakeKernel, n: int = 3) -> tuple[Daemon, Clock]:
    config = dataclasses.replace(rails_config(n), state_dir=str(tmp_path / "state"))
    clock = Clock()
    daemon = Daemon(config, clock=clock, wallclock=lambda: 1.8e9 + clock.t)
    daemon.kernel = kernel
    return daemon, clock


def run(coro):
    return asyncio.run(coro)


async def converge(daemon: Daemon, clock: Clock, rounds: int = 12) -> None:
    """Ticks spaced past any backoff (at most 30 s) and resync."""
    for _ in range(rounds):
        clock.t += 31.0
        await daemon.handle([Tick()])


def start(daemon: Daemon, ports: list[str]) -> None:
    snapshot = LinkSnapshot(samples={p: link(p) for p in ports}, reason="start")
    run(daemon.handle([snapshot]))


def desired_now(daemon: Daemon) -> KernelState:
    assert daemon.decision is not None
    return daemon.decision.desired


def fresh_start_ops(tmp_path) -> int:
    kernel = FakeKernel()
    daemon, _ = make(tmp_path / "count", kernel)
    start(daemon, ["eth0", "eth1", "eth2"])
    return kernel.attempts


def test_fresh_start_converges_with_no_failure(tmp_path):
    kernel = FakeKernel()
    daemon, _ = make(tmp_path, kernel)
    start(daemon, ["eth0", "eth1", "eth2"])
    assert kernel.state == desired_now(daemon)
    assert daemon.failures == {} and daemon.last_error == ""
    assert plan.plan(desired_now(daemon), kernel.state) == []


@pytest.mark.parametrize("step", range(1, 16))
def test_a_refused_write_at_any_step_of_a_fresh_start_skips_only_its_dependents(tmp_path, step):
    total = fresh_start_ops(tmp_path)
    assert total >= 12, total  # 3 nexthops, 1 group, 4 routes, 7 rules in rails_config(3)
    if step > total:
        pytest.skip(f"the plan has {total} writes")
    kernel = FakeKernel()
    refused: list[Op] = []

    def refuse(op, n):
        if n == step:
            refused.append(op)
            return True
        return False

    kernel.refuse = refuse
    daemon, clock = make(tmp_path, kernel)
    start(daemon, ["eth0", "eth1", "eth2"])
    consistent(kernel.state)
    (bad,) = refused
    # everything that does not depend on the refused object is in place
    missing = (plan.simulate_all(kernel.state, [])).routes ^ desired_now(daemon).routes
    for route in missing:
        assert route.nhid == getattr(bad.obj, "id", None) or bad.obj == route or any(
            route.nhid == g.id and getattr(bad.obj, "id", None) in g.members
            for g in desired_now(daemon).groups), f"{route} missing, unrelated to {bad}"
    # named in status, with since when
    problems = daemon.report.status().problems
    assert [p.kind for p in problems] == ["refused"] and problems[0].attempts == 1
    assert daemon.last_error and daemon.last_error_at > 0
    # the kernel accepts it again: converges, the error clears
    kernel.refuse = lambda op, n: False
    run(converge(daemon, clock))
    assert kernel.state == desired_now(daemon)
    assert daemon.failures == {} and daemon.last_error == "" and daemon.report.status().problems == ()


def converged(tmp_path) -> tuple[Daemon, Clock, FakeKernel]:
    kernel = FakeKernel()
    daemon, clock = make(tmp_path, kernel)
    start(daemon, ["eth0", "eth1", "eth2"])
    assert kernel.state == desired_now(daemon)
    return daemon, clock, kernel


def pull_cable(daemon: Daemon, clock: Clock, kernel: FakeKernel, port: str) -> None:
    clock.t += 0.5
    kernel.state = plan.carrier_lost(kernel.state, port)  # what the kernel does on carrier loss
    run(daemon.handle([LinkEvent(link(port, carrier=False))]))


def restore_cable(daemon: Daemon, clock: Clock, port: str) -> None:
    """Carrier back, then ticks through rise and the hold-down."""
    clock.t += 0.5
    run(daemon.handle([LinkEvent(link(port))]))
    for _ in range(daemon.config.timers.rise + 1):
        clock.t += daemon.config.timers.hold_down_s
        run(daemon.handle([Tick()]))


def test_a_refused_write_at_any_step_of_a_failback_keeps_every_route_it_could(tmp_path):
    """Failing back to a repaired port re-creates its nexthop, grows the
    group and moves the rail's route home: refuse each of those writes in
    turn. The rail keeps its backup route until its own path is in place."""
    daemon, clock, kernel = converged(tmp_path / "count")
    pull_cable(daemon, clock, kernel, "eth0")
    run(converge(daemon, clock))
    seen: list[Op] = []
    kernel.refuse = lambda op, n: seen.append(op) and False
    restore_cable(daemon, clock, "eth0")
    assert len(seen) >= 3, seen
    for step, target in enumerate(seen, 1):
        daemon, clock, kernel = converged(tmp_path / f"step{step}")
        pull_cable(daemon, clock, kernel, "eth0")
        run(converge(daemon, clock))
        kernel.refuse = lambda op, n, target=target: op == target  # until cleared
        restore_cable(daemon, clock, "eth0")
        consistent(kernel.state)
        tables = {r.table for r in kernel.state.routes}
        assert all(rail.table in tables for rail in daemon.config.rails), \
            f"step {step}: a rail table lost its route"
        assert daemon.report.status().problems, f"step {step}: the refusal is not reported"
        kernel.refuse = lambda op, n: False
        run(converge(daemon, clock))
        assert kernel.state == desired_now(daemon), f"step {step}: did not converge"
        assert daemon.report.status().problems == ()


def test_a_refused_route_does_not_hold_up_another_rails_failover(tmp_path):
    """rail0's table cannot be written (a foreign route sits in it); rail1's
    cable is pulled: rail1 fails over at once, in the same pass."""
    daemon, clock, kernel = converged(tmp_path)
    table0 = daemon.config.rails[0].table
    kernel.refuse = lambda op, n: getattr(op.obj, "table", None) == table0 and op.kind != "delete"
    pull_cable(daemon, clock, kernel, "eth0")  # rail0's route must move: refused
    assert any(getattr(f.op.obj, "table", None) == table0 for f in daemon.failures.values())
    pull_cable(daemon, clock, kernel, "eth1")
    rail1 = daemon.config.rails[1]
    route = next(r for r in kernel.state.routes if r.table == rail1.table)
    via = next(n.port for n in kernel.state.nexthops if n.id == route.nhid)
    assert via == "eth2", "rail1 did not fail over while rail0's write was refused"


def test_a_refused_write_is_retried_with_backoff_not_every_tick(tmp_path):
    daemon, clock, kernel = converged(tmp_path)
    table0 = daemon.config.rails[0].table
    kernel.refuse = lambda op, n: getattr(op.obj, "table", None) == table0
    pull_cable(daemon, clock, kernel, "eth0")
    tried = kernel.attempts
    for _ in range(5):  # 5 ticks within the first backoff (0.5 s)
        clock.t += 0.05
        run(daemon.handle([Tick()]))
    assert kernel.attempts == tried
    clock.t += 1.0
    run(daemon.handle([Tick()]))
    assert kernel.attempts > tried
    (failure,) = [f for f in daemon.failures.values()]
    assert failure.attempts == 2 and failure.retry_at - clock.t == pytest.approx(1.0)


def test_unexpected_errors_and_unreadable_kernel_are_failed_reconciles_not_the_end(tmp_path):
    daemon, clock, kernel = converged(tmp_path)
    kernel.unexpected = lambda op, n: True
    pull_cable(daemon, clock, kernel, "eth0")  # must not raise
    assert daemon.reconcile_failures == 1 and "RuntimeError" in daemon.last_error
    kernel.unexpected = lambda op, n: False
    kernel.observe_fails = True
    clock.t += 31.0
    run(daemon.handle([Tick()]))
    assert daemon.reconcile_failures == 2 and "dump failed" in daemon.last_error
    kernel.observe_fails = False
    run(converge(daemon, clock))
    assert kernel.state == desired_now(daemon) and daemon.last_error == ""


def test_a_failed_netlink_socket_is_replaced_and_the_next_pass_reads_through_a_fresh_one(tmp_path):
    daemon, clock, kernel = converged(tmp_path)
    kernel.socket_broken = True
    clock.t += 31.0  # resync due: the read fails on the broken socket
    run(daemon.handle([Tick()]))
    assert daemon.reconcile_failures == 1 and "netlink socket failed" in daemon.last_error
    assert kernel.sockets_replaced == 1 and not kernel.socket_broken
    run(converge(daemon, clock))
    assert daemon.last_error == "" and kernel.state == desired_now(daemon)
    # a kernel refusal of a dump is not a socket failure: the socket stays
    kernel.observe_fails = True
    clock.t += 31.0
    run(daemon.handle([Tick()]))
    assert kernel.sockets_replaced == 1


def test_a_failed_pass_is_retried_with_backoff_but_a_new_decision_goes_at_once(tmp_path):
    daemon, clock, kernel = converged(tmp_path)
    kernel.observe_fails = True
    clock.t += 31.0  # resync due: the read fails
    run(daemon.handle([Tick()]))
    failures = daemon.reconcile_failures
    for _ in range(3):
        clock.t += 0.1
        run(daemon.handle([Tick()]))
    assert daemon.reconcile_failures == failures, "retried before the backoff"
    kernel.observe_fails = False
    pull_cable(daemon, clock, kernel, "eth1")  # a new decision: not held back
    rail1 = daemon.config.rails[1]
    route = next(r for r in kernel.state.routes if r.table == rail1.table)
    assert next(n.port for n in kernel.state.nexthops if n.id == route.nhid) != "eth1"


def test_verdicts_are_written_on_change_and_carried_into_the_next_start(tmp_path):
    daemon, clock, kernel = converged(tmp_path)
    pull_cable(daemon, clock, kernel, "eth0")
    assert daemon.health["eth0"].verdict is Verdict.DOWN
    # a restart: a new daemon, the same state dir, carrier back on eth0
    kernel.state = kernel.state  # fail-static: the kernel keeps its routes
    again, clock2 = make(tmp_path, kernel)
    again.adopt(kernel.state)
    start(again, ["eth0", "eth1", "eth2"])
    eth0 = again.health["eth0"]
    assert eth0.verdict is Verdict.DOWN and "before restart" in eth0.reason
    assert again.health["eth1"].verdict is Verdict.UP


def test_a_carried_bad_verdict_that_names_no_signal_awaits_the_ports_own_probes(tmp_path):
    """A verdict saved before its signal was confirmed names nothing to wait
    for: after a restart the port's own probes must prove it all the same
    (else it would be trusted after rise + hold-down on carrier alone)."""
    import json

    from linkpassd.core import carried as carriedmod
    kernel = FakeKernel()
    daemon, clock = make(tmp_path, kernel)
    rails = tuple(dataclasses.replace(r, probe_peers=("198.19.9.1",)) if r.port == "eth0" else r
                  for r in daemon.config.rails)
    config = dataclasses.replace(daemon.config, rails=rails,
                                 probes=dataclasses.replace(daemon.config.probes, enabled=True))
    state_dir = tmp_path / "state"
    state_dir.mkdir(parents=True, exist_ok=True)
    doc = carriedmod.encode({"eth0": (Verdict.DOWN, "echo: 8 of 8 burst probes lost", ())},
                            1.8e9 + clock.t)
    (state_dir / "verdicts.json").write_text(json.dumps(doc))
    again = Daemon(config, clock=clock, wallclock=lambda: 1.8e9 + clock.t)
    again.kernel = kernel
    again.adopt(None)
    start(again, ["eth0", "eth1", "eth2"])
    eth0 = again.health["eth0"]
    assert eth0.verdict is Verdict.DOWN and eth0.awaiting == ("echo",)
    for _ in range(5):  # carrier alone, however long, does not bring it back
        clock.t += 5.0
        run(again.handle([Tick()]))
    assert again.health["eth0"].verdict is not Verdict.UP
