"""The daemon's operator side without a kernel: drains move traffic and
survive a restart, events record each decision once and in order, and the
health document follows every change."""

import asyncio
import json

from linkpassd.adapters.healthfile import HealthFile, own_pid_namespace
from linkpassd.adapters.links import LinkEvent
from linkpassd.core.events import EventKind
from linkpassd.core.model import Drain, Verdict
from linkpassd.daemon.loop import Tick
from linkpassd.daemon.operations import DrainCommand
from test_daemon_faults import FakeKernel, link, make, run, start

PORTS = ["eth0", "eth1", "eth2"]


def table_port(daemon, kernel, port: str) -> str:
    """The port the kernel routes `port`'s rail table through."""
    rail = next(r for r in daemon.config.rails if r.port == port)
    route = next(r for r in kernel.state.routes if r.table == rail.table)
    return next(n.port for n in kernel.state.nexthops if n.id == route.nhid)


def drain_cmd(port: str, until: float | None = None) -> DrainCommand:
    async def make_cmd():
        done = asyncio.get_running_loop().create_future()
        return DrainCommand(port, Drain(port, "optic swap", "alice (uid 1000)", 1.8e9, until),
                            "alice (uid 1000)", done)
    return asyncio.run(make_cmd())


def started(tmp_path):
    kernel = FakeKernel()
    daemon, clock = make(tmp_path, kernel)
    start(daemon, PORTS)
    return daemon, clock, kernel


def kinds(daemon, after: int = 0) -> list[tuple[int, str, str]]:
    events, missed = daemon.recorder.feed.log.after(after)
    assert missed == 0
    return [(e.seq, str(e.kind), e.port) for e in events]


def test_a_drain_moves_the_rails_table_off_the_port_and_an_undrain_brings_it_back(tmp_path):
    daemon, clock, kernel = started(tmp_path)
    assert table_port(daemon, kernel, "eth0") == "eth0"
    seen = daemon.recorder.feed.log.last_seq
    run(daemon.handle([drain_cmd("eth0")]))
    assert table_port(daemon, kernel, "eth0") != "eth0"
    state = daemon.port_states(clock.t)["eth0"]
    assert state.verdict is Verdict.DEGRADED and state.drain.by == "alice (uid 1000)"
    assert daemon.health["eth0"].verdict is Verdict.UP  # its health is untouched
    assert [k for _, k, _ in kinds(daemon, seen)][:2] == ["drain", "rail_path"]
    saved = json.loads((tmp_path / "state" / "drains.json").read_text())
    assert [d["port"] for d in saved["drains"]] == ["eth0"]

    cmd = DrainCommand("eth0", None, "root (uid 0)", drain_cmd("eth0").done)
    run(daemon.handle([cmd]))
    assert table_port(daemon, kernel, "eth0") == "eth0"
    assert json.loads((tmp_path / "state" / "drains.json").read_text())["drains"] == []


def test_a_drain_survives_a_restart(tmp_path):
    daemon, clock, kernel = started(tmp_path)
    run(daemon.handle([drain_cmd("eth0")]))
    again, _ = make(tmp_path, kernel)  # same state dir, same kernel (fail-static)
    again.drains.load()
    start(again, PORTS)
    assert again.port_states(again.clock())["eth0"].verdict is Verdict.DEGRADED
    assert table_port(again, kernel, "eth0") != "eth0"


def test_a_drain_for_a_duration_expires_by_itself(tmp_path):
    daemon, clock, kernel = started(tmp_path)
    until = 1.8e9 + clock.t + 60.0
    run(daemon.handle([drain_cmd("eth0", until=until)]))
    clock.t += 59.0
    run(daemon.handle([Tick()]))
    assert table_port(daemon, kernel, "eth0") != "eth0"
    seen = daemon.recorder.feed.log.last_seq
    clock.t += 1.0
    run(daemon.handle([Tick()]))
    assert table_port(daemon, kernel, "eth0") == "eth0"
    expired = [e for e in daemon.recorder.feed.log.after(seen)[0] if e.kind is EventKind.UNDRAIN]
    assert [e.field("how") for e in expired] == ["expired"]


def test_a_cable_pull_is_recorded_as_verdict_then_path_in_sequence(tmp_path):
    daemon, clock, kernel = started(tmp_path)
    seen = daemon.recorder.feed.log.last_seq
    clock.t += 0.1
    run(daemon.handle([LinkEvent(link("eth1", carrier=False))]))
    events, missed = daemon.recorder.feed.log.after(seen)
    assert missed == 0 and [e.seq for e in events] == list(range(seen + 1, seen + 1 + len(events)))
    verdict = next(e for e in events if e.kind is EventKind.VERDICT)
    path = next(e for e in events if e.kind is EventKind.RAIL_PATH and e.port == "eth1")
    assert verdict.port == "eth1" and verdict.field("verdict") == "DOWN"
    assert verdict.seq < path.seq and path.field("cause") == "carrier"
    assert path.wall == 1.8e9 + clock.t


def test_the_health_document_follows_each_change_and_is_written(tmp_path):
    daemon, clock, kernel = started(tmp_path)
    daemon.healthdoc.file = HealthFile(str(tmp_path / "run" / "health.json"))
    clock.t += 0.1
    run(daemon.handle([Tick()]))  # due: the first document
    first = daemon.healthdoc.doc.generation
    run(daemon.handle([LinkEvent(link("eth1", carrier=False))]))
    assert daemon.healthdoc.doc.generation == first + 1
    doc = json.loads((tmp_path / "run" / "health.json").read_text())
    usable = {p["port"]: p["usable"] for p in doc["ports"]}
    assert usable == {"eth0": True, "eth1": False, "eth2": True}
    assert doc["pid_ns"] == own_pid_namespace() != 0  # nccl-env may check our pid
    clock.t += 0.1
    run(daemon.handle([Tick()]))  # nothing changed, refresh not due: no new document
    assert daemon.healthdoc.doc.generation == first + 1


def test_the_control_api_drain_returns_after_the_pass_that_moved_the_traffic(tmp_path):
    daemon, clock, kernel = started(tmp_path)

    async def scenario():
        loop_task = asyncio.create_task(daemon.reconcile_loop())
        try:
            state = await daemon.drains.drain("eth2", "flapping optic", 3600.0, "root (uid 0)")
            assert table_port(daemon, kernel, "eth2") != "eth2"  # already moved on return
            return state
        finally:
            loop_task.cancel()

    outcome = asyncio.run(scenario())
    state = outcome.state
    assert state.verdict is Verdict.DEGRADED and state.drain.reason == "flapping optic"
    assert state.drain.until == state.drain.at + 3600.0
    assert outcome.replaced is None and outcome.notes == ()  # the traffic moved


def control_drains(daemon, *calls):
    """Each (port, reason, duration_s) through the control API's drain, in turn."""
    async def scenario():
        loop_task = asyncio.create_task(daemon.reconcile_loop())
        try:
            return [await daemon.drains.drain(port, reason, duration_s, "root (uid 0)")
                    for port, reason, duration_s in calls]
        finally:
            loop_task.cancel()
    return asyncio.run(scenario())


def test_a_second_drain_replaces_the_first_and_says_so(tmp_path):
    """Issue 28: a second drain silently replaced the first's --for. The
    newest drain wins (its --for counts from now; none: until undrain), the
    answer and the event name the drain it replaced."""
    daemon, clock, kernel = started(tmp_path)
    first, second = control_drains(daemon, ("eth0", "optic swap", 1800.0),
                                   ("eth0", "optic swap, vendor late", 7200.0))
    assert first.replaced is None
    assert second.replaced == first.state.drain
    assert second.state.drain.until == second.state.drain.at + 7200.0
    assert daemon.drains.by_port["eth0"].reason == "optic swap, vendor late"
    event = daemon.recorder.feed.log.last(10)
    drained = [e for e in event if e.kind is EventKind.DRAIN]
    assert "replaces the drain by root (uid 0)" in drained[-1].message
    assert drained[-1].field("replaced_by") == "root (uid 0)"


def test_a_drain_that_cannot_move_traffic_says_where_it_stays(tmp_path):
    """Issue 28: a drain with no healthy alternative just said "drained".
    Draining every port: the last one keeps the traffic, and says why."""
    daemon, clock, kernel = started(tmp_path)
    a, b, c = control_drains(daemon, *[(p, "rack move", None) for p in PORTS])
    assert a.notes == () and b.notes == ()
    assert c.notes and all("traffic stays on eth2" in n and "no healthy" in n for n in c.notes)
    assert any("rail" in n for n in c.notes)


def test_draining_the_backup_does_not_move_a_drained_primary_back(tmp_path):
    """Issue 28: drain eth0 (its table moves away), then drain where it
    went: the table must not come back to eth0."""
    daemon, clock, kernel = started(tmp_path)
    run(daemon.handle([drain_cmd("eth0")]))
    moved_to = table_port(daemon, kernel, "eth0")
    assert moved_to != "eth0"
    others = [p for p in PORTS if p not in ("eth0", moved_to)]
    control_drains(daemon, *[(p, "rack move", None) for p in others + [moved_to]])
    assert table_port(daemon, kernel, "eth0") == moved_to


def test_a_foreign_object_found_in_the_same_pass_as_a_cable_pull_holds_up_nothing(tmp_path):
    from linkpassd.core.model import ForeignObject
    daemon, clock, kernel = started(tmp_path)
    kernel.foreign = (ForeignObject("nexthop", 99, "nexthop id 1000150 via 198.18.9.9 proto 99",
                                    id=1_000_150),)
    daemon.needs_resync = True  # the pass re-reads and finds it
    seen = daemon.recorder.feed.log.last_seq
    clock.t += 0.1
    run(daemon.handle([LinkEvent(link("eth1", carrier=False))]))
    assert table_port(daemon, kernel, "eth1") != "eth1"  # the failover happened
    assert daemon.reconcile_failures == 0 and daemon.last_error == ""
    conflict = [e for e in daemon.recorder.feed.log.after(seen)[0] if e.kind is EventKind.CONFLICT]
    assert [e.field("object_kind") for e in conflict] == ["nexthop"]


def answered(cmd: DrainCommand):
    return cmd.done.exception() if cmd.done.done() else "unanswered"


def test_a_drain_whose_routes_cannot_move_is_answered_as_pending_but_kept(tmp_path):
    from linkpassd.core import drain
    daemon, clock, kernel = started(tmp_path)
    kernel.refuse = lambda op, n: True  # the kernel refuses every write
    cmd = drain_cmd("eth0")
    run(daemon.handle([cmd]))
    assert isinstance(answered(cmd), drain.DrainPending)
    assert "recorded and kept" in str(answered(cmd)) and "injected refusal" in str(answered(cmd))
    assert "eth0" in daemon.drains.by_port and table_port(daemon, kernel, "eth0") == "eth0"
    kernel.refuse = lambda op, n: False
    clock.t += 31.0
    run(daemon.handle([Tick()]))  # the retry moves it
    assert table_port(daemon, kernel, "eth0") != "eth0"


def test_a_drain_queued_behind_a_shutdown_is_answered_as_not_taken(tmp_path):
    import pytest

    from linkpassd.core import drain
    from linkpassd.daemon.loop import Shutdown, ShutdownRequested
    daemon, clock, kernel = started(tmp_path)
    cmd = drain_cmd("eth0")
    with pytest.raises(ShutdownRequested):
        run(daemon.handle([Shutdown("SIGTERM"), cmd]))
    assert isinstance(answered(cmd), drain.DrainNotTaken)
    assert daemon.drains.by_port == {}


def test_a_settled_drain_is_answered_with_success(tmp_path):
    daemon, clock, kernel = started(tmp_path)
    cmd = drain_cmd("eth0")
    run(daemon.handle([cmd]))
    assert cmd.done.done() and cmd.done.exception() is None


def test_a_port_removed_by_a_reload_can_still_be_undrained(tmp_path):
    import dataclasses
    daemon, clock, kernel = started(tmp_path)
    daemon.drains.by_port["eth9"] = Drain("eth9", "gone NIC", "root (uid 0)", 1.0)  # e.g. from drains.json

    async def scenario():
        loop_task = asyncio.create_task(daemon.reconcile_loop())
        try:
            await daemon.drains.undrain("eth9", "root (uid 0)")
        finally:
            loop_task.cancel()

    asyncio.run(scenario())
    assert "eth9" not in daemon.drains.by_port
    assert dataclasses.asdict(daemon.recorder.feed.log.last(1)[0])["port"] == "eth9"


def test_explain_says_hold_down_until_when_while_carrier_is_back(tmp_path, monkeypatch):
    """Issue 28: `explain` said "no carrier" while the carrier was back and
    the port in its hold-down. It says hold-down, and until when."""
    import time as time_mod

    from linkpassd.adapters import control_convert
    from linkpassd.ctl.render import render_explanation
    from test_daemon_faults import pull_cable
    daemon, clock, kernel = started(tmp_path)
    pull_cable(daemon, clock, kernel, "eth1")
    clock.t += 0.5
    run(daemon.handle([LinkEvent(link("eth1"))]))  # carrier back: hold-down starts now
    back_at = clock.t
    explained = daemon.report.explain("eth1")
    state = explained.state
    assert state.verdict is Verdict.DOWN and state.phase == "RECOVERING" and state.carrier
    assert state.evidence[0].startswith("in hold-down after: no carrier")
    assert state.hold_until == 1.8e9 + back_at + daemon.config.timers.hold_down_s  # unix time
    monkeypatch.setenv("TZ", "UTC0")
    time_mod.tzset()
    try:
        text = render_explanation(control_convert.explanation_to_proto(explained, served_at=1.8e9 + clock.t))
    finally:
        monkeypatch.undo()
        time_mod.tzset()
    summary = text.splitlines()[0]
    assert "in hold-down after: no carrier" in summary
    assert summary.endswith("In hold-down until 2027-01-15T08:16:46+00:00."), summary
    assert any(line.startswith("hold-down") and "until 2027-01-15T08:16:46+00:00 (in 5.0s)" in line
               for line in text.splitlines()), text
    clock.t += daemon.config.timers.hold_down_s
    for _ in range(daemon.config.timers.rise):
        clock.t += 0.1
        run(daemon.handle([Tick()]))
    after = daemon.report.explain("eth1").state
    assert after.verdict is Verdict.UP and after.hold_until == 0.0


def test_a_configured_port_that_does_not_exist_says_no_such_port(tmp_path):
    """Issue 28: a configured port that does not exist read "found failed
    over at start" (its table is on a backup since it never had a nexthop)."""
    from linkpassd.adapters.links import LinkSnapshot
    from linkpassd.core.model import LinkSample
    snap = LinkSnapshot(samples={"eth0": link("eth0"), "eth1": LinkSample.missing("eth1"),
                                 "eth2": link("eth2")}, reason="start")  # eth1 configured, not there
    kernel = FakeKernel()
    daemon, clock = make(tmp_path, kernel)
    run(daemon.handle([snap]))
    assert table_port(daemon, kernel, "eth1") != "eth1"
    # A start without the verdict file finds rail1's table on a backup.
    again, _ = make(tmp_path / "fresh", kernel)
    again.adopt(kernel.state)
    run(again.handle([snap]))
    state = again.port_states(again.clock())["eth1"]
    assert state.verdict is Verdict.DOWN
    assert state.evidence[0].startswith("no such port: the interface does not exist"), state.evidence
    assert "before this start: found failed over at start" in state.evidence[0]
