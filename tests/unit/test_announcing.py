"""The daemon's announce step (linkpassd.daemon.announcing) with a recording
adapter: events per change, FRR's state in problems and events, refusals
reported, failures never raised into the loop, metrics counted."""

from dataclasses import replace
from types import SimpleNamespace

import pytest

from corefixtures import port, ports, rails_config
from linkpassd.adapters.announce import ApplyResult, FrrState
from linkpassd.adapters.metrics import Metrics
from linkpassd.core import policy
from linkpassd.core.events import EventKind, EventLog
from linkpassd.core.model import AnnounceSettings, Verdict
from linkpassd.daemon import announcing


class FakeAnnouncer:
    instances: list = []

    def __init__(self, ipr, settings, frr_run_dir):
        self.settings = settings
        self.applied: list[dict] = []
        self.frr = FrrState()
        self.held = None  # None: every configured address is held
        self.fail: Exception | None = None
        FakeAnnouncer.instances.append(self)

    async def apply(self, config, desired):
        if self.fail is not None:
            raise self.fail
        self.applied.append(dict(desired))
        refused = sorted(a for a in desired if self.held is not None and a not in self.held)
        return ApplyResult(refused=refused, added=[(a, x.metric) for a, x in desired.items()
                                                   if a not in refused])

    async def frr_state(self, announced):
        return self.frr


@pytest.fixture
def daemon(monkeypatch):
    FakeAnnouncer.instances.clear()
    monkeypatch.setattr(announcing, "Announcer", FakeAnnouncer)
    cfg = replace(rails_config(2), announce=AnnounceSettings(enabled=True))
    log = EventLog("b00t")
    d = SimpleNamespace(config=cfg, events=[])

    def emit(kind, name, *, port="", rail="", severity=None, message="", **fields):
        kw = {"severity": severity} if severity is not None else {}
        d.events.append(log.append(kind, name, wall=1000.0, mono=1.0, port=port, rail=rail,
                                   message=message, **kw, **fields))
    d.step = announcing.Announcements(emit, lambda: 1000.0, make_ipr=lambda: object())
    return d


def run(coro):
    import asyncio
    return asyncio.run(coro)


def step(d, now, **verdicts):
    states = ports(d.config, **{p: port(p, v, carrier=True) for p, v in verdicts.items()})
    run(d.step.step(d.config, policy.decide(d.config, states), now))


def test_changes_are_events_and_frr_state_is_a_problem_then_clears(daemon):
    step(daemon, 0.0)
    (fake,) = FakeAnnouncer.instances
    assert [(e.field("address"), e.field("change"), e.field("previous")) for e in daemon.events] \
        == [("198.18.0.1", "announced", "unknown"), ("198.18.1.1", "announced", "unknown")]
    daemon.events.clear()
    step(daemon, 0.5, eth0=Verdict.DEGRADED)
    (e,) = daemon.events
    assert e.kind is EventKind.ANNOUNCE and e.rail == "rail0"
    assert (e.field("change"), e.field("via"), e.field("previous")) == ("detoured", "rail1", "rail0")
    assert fake.applied[-1]["198.18.0.1"].via == "rail1"

    daemon.events.clear()
    fake.frr = FrrState(missing_daemons=("bgpd",))
    step(daemon, 10.0, eth0=Verdict.DEGRADED)  # past the FRR check interval
    (e,) = daemon.events
    assert e.field("frr") == "missing" and "bgpd" in e.field("problems")
    (p,) = daemon.step.problems()
    assert p.kind == "announce" and "FRR not running: bgpd" in p.detail
    assert "outgoing failover goes on" in p.detail

    daemon.events.clear()
    fake.frr = FrrState()
    step(daemon, 20.0)
    # trusted again: first settling over the detour's session, then home after settle_s
    assert [e.field("change") for e in daemon.events if e.field("change")] == ["settling"]
    assert fake.applied[-1]["198.18.0.1"].via == "rail1"
    step(daemon, 20.0 + daemon.config.announce.settle_s)
    assert [e.field("change") for e in daemon.events if e.field("change")] == \
        ["settling", "restored"]
    assert fake.applied[-1]["198.18.0.1"].via == "rail0"
    # FRR's state is read a moment after the latest write, not in the writing steps
    assert not [e for e in daemon.events if e.field("frr")]
    step(daemon, 20.0 + daemon.config.announce.settle_s + announcing.FRR_CHECK_AFTER_WRITE_S)
    assert {e.field("frr") for e in daemon.events if e.field("frr")} == {"ok"}
    assert daemon.step.problems() == []

    m = Metrics(lambda: None)
    for e in daemon.events:
        m.on_event(e)
    assert m.announce_changes.labels("rail0", "restored")._value.get() == 1
    assert m.announce_frr_ok.labels("250")._value.get() == 1


def test_refused_addresses_are_a_problem(daemon):
    step(daemon, 0.0)
    FakeAnnouncer.instances[0].held = {"198.18.1.1"}
    step(daemon, 0.5, eth0=Verdict.DEGRADED)
    (p,) = daemon.step.problems()
    assert "198.18.0.1" in p.detail and "not held" in p.detail


def test_a_failing_adapter_never_raises_and_is_retried(daemon):
    step(daemon, 0.0)
    fake = FakeAnnouncer.instances[0]
    fake.fail = OSError("netlink gone")
    step(daemon, 0.5, eth0=Verdict.DEGRADED)  # does not raise
    (p,) = daemon.step.problems()
    assert "netlink gone" in p.detail
    fake.fail = None
    step(daemon, 0.6, eth0=Verdict.DEGRADED)
    assert fake.applied[-1]["198.18.0.1"].via == "rail1" and daemon.step.problems() == []


def test_turned_off_withdraws_what_was_written(daemon):
    step(daemon, 0.0)
    fake = FakeAnnouncer.instances[0]
    daemon.config = replace(daemon.config, announce=AnnounceSettings(enabled=False))
    step(daemon, 0.5)
    assert fake.applied[-1] == {} and daemon.step.state is None


class LaggingZebra(FakeAnnouncer):
    """zebra imports a written table within milliseconds, but not within the
    step that wrote it: read in that step, what was just written is missing."""

    def __init__(self, *a):
        super().__init__(*a)
        self.fresh = False

    async def apply(self, config, desired):
        self.fresh = True
        return await super().apply(config, desired)

    async def frr_state(self, announced):
        return FrrState(not_imported=tuple(sorted(announced)) if self.fresh else ())


def test_frr_is_never_judged_in_the_step_that_wrote_the_table(daemon, monkeypatch):
    """The lab showed "FRR cannot announce: not imported by zebra" for a
    moment after every restore: the check 1 s after the settling write fell
    due in the very step that wrote the restore (settle_s is 1 s too), and
    read zebra's import before it could have happened."""
    monkeypatch.setattr(announcing, "Announcer", LaggingZebra)
    settle = daemon.config.announce.settle_s
    assert settle == announcing.FRR_CHECK_AFTER_WRITE_S  # the defaults that met

    def at(now, **verdicts):
        for fake in FakeAnnouncer.instances:
            fake.fresh = False  # time passed: zebra has imported what was written
        step(daemon, now, **verdicts)

    at(0.0)
    at(0.5, eth0=Verdict.DEGRADED)  # detoured
    at(20.0)  # trusted again: settling
    at(20.0 + settle)  # restored, the check after the settling write due now
    at(20.0 + settle + announcing.FRR_CHECK_AFTER_WRITE_S)  # read after the write
    assert [e.field("change") for e in daemon.events if e.field("change")] == \
        ["announced", "announced", "detoured", "settling", "restored"]
    assert [e.field("problems") for e in daemon.events if e.name == "announce_frr"] == []
    assert daemon.step.problems() == []
