"""The daemon's fence step (linkpassd.daemon.fencing) with a recording
netlink stand-in: the owner is on disk before a port goes down, a restart
tests what it left down, fencing turned off brings ports up, a failed write
is a problem and is retried, the overlay keeps routes off held ports, and the
events feed the metrics."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

from corefixtures import rails_config
from linkpassd.adapters.metrics import Metrics
from linkpassd.core import health
from linkpassd.core.events import EventKind, EventLog
from linkpassd.core.fence import State
from linkpassd.core.model import Assessment, FenceSettings, LinkSample, PortState, Verdict
from linkpassd.daemon import fencing

SETTINGS = FenceSettings(enabled=True, fence_after_s=2.0, backoff_initial_s=10.0,
                         backoff_max_s=40.0, test_window_s=1.0, test_timeout_s=5.0,
                         require_leaf_grant=False)


class FakeIpr:
    def __init__(self, d):
        self.d = d
        self.up = {"eth0": True, "eth1": True}
        self.fail: Exception | None = None

    async def link(self, command, **kw):
        if command == "get":
            name = kw["ifname"]
            return [{"index": 1 + ["eth0", "eth1"].index(name)}] if name in self.up else []
        if self.fail is not None:
            raise self.fail
        name = ["eth0", "eth1"][kw["index"] - 1]
        # what the file said when the write was made
        path = self.d.tmp / fencing.FENCE_FILE
        self.d.writes.append((name, kw["state"], json.loads(path.read_text()) if path.exists()
                              else None))
        self.up[name] = kw["state"] == "up"
        return []

    def close(self):
        pass


@pytest.fixture
def d(tmp_path):
    cfg = replace(rails_config(2), fence=SETTINGS, state_dir=str(tmp_path))
    log = EventLog("b00t")
    ns = SimpleNamespace(config=cfg, events=[], writes=[], tmp=tmp_path)

    def emit(kind, name, *, port="", rail="", severity=None, message="", **fields):
        kw = {"severity": severity} if severity is not None else {}
        ns.events.append(log.append(kind, name, wall=1000.0, mono=1.0, port=port, rail=rail,
                                    message=message, **kw, **fields))
    ns.ipr = FakeIpr(ns)
    ns.f = fencing.Fencing(emit, lambda: 1000.0, make_ipr=lambda: ns.ipr)
    return ns


def link(port, up=True):
    return LinkSample(port, present=True, admin_up=up, carrier=up, operstate="UP" if up else "DOWN")


def port_health(port, echo: Verdict | None, now=0.0, up=True, peers=2):
    h = health.initial(link(port, up), now)
    if echo is not None:
        h = health.observe_probe(h, "echo", Assessment("echo", echo, str(echo).lower(),
                                                       witnesses=peers), now,
                                 rails_config(2).timers)
    return h


def step(d, now, eth0=Verdict.DOWN, eth0_up=True, peers=2):
    healths = {"eth0": port_health("eth0", eth0, up=eth0_up, peers=peers),
               "eth1": port_health("eth1", Verdict.UP)}
    links = {"eth0": link("eth0", eth0_up), "eth1": link("eth1")}
    d.f.decide(d.config, healths, links, (), now)
    asyncio.run(d.f.act())


def test_a_rail_down_towards_its_one_echo_peer_is_not_fenced(d):
    """Its only peer may be the host that failed (min_echo_peers 2)."""
    for now in (0.0, 2.1, 10.0, 60.0):
        step(d, now, peers=1)
    assert d.writes == [] and d.f.fences["eth0"].state is State.ARMED


def test_fenced_after_fence_after_with_the_owner_on_disk_first(d):
    step(d, 0.0)
    step(d, 1.9)
    assert d.writes == []
    step(d, 2.1)
    ((port, state, on_disk),) = d.writes
    assert (port, state) == ("eth0", "down")
    assert on_disk["down"] == {"eth0": {"backoff_s": 10.0}}
    assert d.f.fences["eth0"].state is State.FENCED
    names = [e.name for e in d.events]
    assert names == ["fence_fence"]
    (e,) = d.events
    assert e.kind is EventKind.FENCE and e.field("state") == "FENCED" and e.port == "eth0"
    # up for a test after the backoff; routes kept away by the overlay meanwhile
    step(d, 12.2, eth0=Verdict.DOWN, eth0_up=False)
    assert d.writes[-1][:2] == ("eth0", "up")
    states = {p: PortState(p, Verdict.UP, True, "UP", 0.0) for p in ("eth0", "eth1")}
    assert d.f.overlay(states, 12.3)["eth0"].verdict is Verdict.DOWN
    # its own probes UP for the test window: unfenced, the file empty again
    step(d, 12.4, eth0=Verdict.UP)
    step(d, 13.5, eth0=Verdict.UP)
    assert d.f.fences["eth0"].state is State.ARMED
    assert json.loads((d.tmp / fencing.FENCE_FILE).read_text())["down"] == {}
    assert d.f.overlay(states, 13.6)["eth0"].verdict is Verdict.UP
    assert [e.name for e in d.events] == ["fence_fence", "fence_test", "fence_unfence"]

    m = Metrics(lambda: None)
    for e in d.events:
        m.on_event(e)
    assert m.fence_actions.labels("eth0", "fence")._value.get() == 1
    assert m.fence_actions.labels("eth0", "unfence")._value.get() == 1
    assert m.fence_holding.labels("eth0")._value.get() == 0


def test_no_leaf_grant_holds_the_fence_and_says_so(d):
    d.config = replace(d.config, fence=replace(SETTINGS, require_leaf_grant=True))
    step(d, 0.0)
    step(d, 5.0)
    step(d, 6.0)
    assert d.writes == []
    held = [e for e in d.events if e.name == "fence_held"]
    assert len(held) == 1 and "no stream to the aggregator" in held[0].field("reason")
    m = Metrics(lambda: None)
    for e in d.events:
        m.on_event(e)
    assert m.fence_held_back.labels("eth0")._value.get() == 1
    # a stream, no grant: asked; then granted: fenced
    d.f.granted(["eth1"])
    step(d, 7.0)
    assert d.writes == [] and d.f.fences["eth0"].asking
    assert "asked the aggregator" in d.events[-1].field("reason")
    d.f.granted(["eth0"])
    step(d, 7.1)
    assert d.writes[-1][:2] == ("eth0", "down") and not d.f.fences["eth0"].asking
    # the stream ends: the fence made stays
    d.f.granted(None)
    step(d, 8.0, eth0_up=False)
    assert d.f.fences["eth0"].state is State.FENCED


def test_a_restart_tests_what_it_left_down(d):
    (d.tmp / fencing.FENCE_FILE).write_text(json.dumps(
        {"version": 1, "written_at": 1.0, "down": {"eth0": {"backoff_s": 20.0}}}))
    d.ipr.up["eth0"] = False
    d.f.load(d.config, 100.0)
    assert d.f.fences["eth0"].state is State.TESTING
    step(d, 100.1, eth0=Verdict.DOWN, eth0_up=False)  # the first act brings it up
    assert d.writes[0][:2] == ("eth0", "up")
    # no proof within test_timeout_s: down again, with the doubled backoff
    step(d, 105.2, eth0=Verdict.DOWN)
    assert d.writes[-1][:2] == ("eth0", "down")
    assert d.f.fences["eth0"].backoff_s == 40.0


def test_turned_off_brings_up_what_the_last_daemon_left_down(d):
    (d.tmp / fencing.FENCE_FILE).write_text(json.dumps(
        {"version": 1, "written_at": 1.0, "down": {"eth0": {"backoff_s": 20.0}}}))
    d.config = replace(d.config, fence=FenceSettings())
    d.f.load(d.config, 100.0)
    step(d, 100.1, eth0=Verdict.DOWN, eth0_up=False)
    assert d.writes[0][:2] == ("eth0", "up")
    step(d, 200.0, eth0=Verdict.DOWN)
    assert len(d.writes) == 1 and d.f.fences["eth0"].state is State.ARMED


def test_an_unusable_file_is_a_problem_naming_it(d):
    (d.tmp / fencing.FENCE_FILE).write_text(json.dumps({"version": 1, "down": {"eth0": "x"}}))
    d.f.load(d.config, 0.0)
    (p,) = d.f.problems()
    assert fencing.FENCE_FILE in p.what and "backoff_s" in p.detail


def test_a_refused_write_is_a_problem_and_is_retried(d):
    step(d, 0.0)
    d.ipr.fail = OSError("netlink gone")
    step(d, 2.1)  # does not raise
    (p,) = d.f.problems()
    assert "eth0" in p.detail and "netlink gone" in p.detail
    d.ipr.fail = None
    step(d, 2.2)
    assert d.writes[-1][:2] == ("eth0", "down") and d.f.problems() == []


def test_a_clean_stop_brings_fenced_ports_up(d):
    step(d, 0.0)
    step(d, 2.1)
    asyncio.run(d.f.stop())
    assert d.writes[-1][:2] == ("eth0", "up")
    assert json.loads((d.tmp / fencing.FENCE_FILE).read_text())["down"] == {}


def test_operator_lift_brings_the_port_up(d):
    step(d, 0.0)
    step(d, 2.1)
    d.f.lift("eth0", 100.0, 3.0, "alice (uid 1000)")
    step(d, 3.1, eth0=Verdict.DOWN, eth0_up=False)
    assert d.writes[-1][:2] == ("eth0", "up")
    assert d.f.fences["eth0"].state is State.LIFTED
    assert "alice" in d.events[-1].message
    step(d, 60.0)  # still dead, but lifted
    assert d.writes[-1][:2] == ("eth0", "up")
    with pytest.raises(fencing.UnknownPort):
        d.f.lift("eth9", 1.0, 1.0, "x")


def test_a_port_not_fenced_for_lack_of_witnesses_says_so(d):
    step(d, 0.0, peers=1)
    step(d, 10.0, peers=1)
    states = {p: PortState(p, Verdict.DOWN, True, "UP", 0.0) for p in ("eth0", "eth1")}
    (line,) = [e for e in d.f.overlay(states, 10.0)["eth0"].evidence if e.startswith("fence ")]
    assert line.startswith("fence not fenced: its DOWN rests on echo paths to 1 peer(s)"), line
    step(d, 11.0, eth0=Verdict.UP)
    assert not [e for e in d.f.overlay(states, 11.0)["eth0"].evidence if e.startswith("fence ")]
