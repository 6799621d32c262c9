"""Verdicts carried over restarts and reloads (core.carried, core.health):
a port that was not trusted stays not trusted until the signals that
condemned it say otherwise, then rise and the hold-down."""

from __future__ import annotations

import pytest

from corefixtures import rails_config
from linkpassd.core import carried, health
from linkpassd.core.model import Assessment, KernelState, LinkSample, Nexthop, Route, Timers, Verdict

TIMERS = Timers(rise=2, hold_down_s=5.0)
UP_SAMPLE = LinkSample(port="eth0", present=True, ifindex=2, admin_up=True, carrier=True,
                       operstate="UP")


def echo(status: str) -> Assessment:
    severity = {"up": Verdict.UP, "down": Verdict.DOWN, "never up": None}[status]
    return Assessment("echo", severity, status)


def restored(awaiting=("echo",)) -> health.PortHealth:
    state = health.initial(UP_SAMPLE, 0.0)
    assert state.verdict is Verdict.UP  # a healthy link alone would be trusted at once
    return health.restore(state, Verdict.DOWN, "DOWN before restart", awaiting, 0.0)


def tick(state, t):
    return health.observe(state, UP_SAMPLE, t, TIMERS)


def test_a_restored_port_stays_down_while_its_probe_has_no_opinion():
    state = restored()
    for t in range(1, 60):
        state = tick(state, float(t))
        state = health.observe_probe(state, "echo", echo("never up"), float(t), TIMERS)
    assert state.verdict is Verdict.DOWN and state.awaiting == ("echo",)
    assert "awaiting proof from echo" in health.evaluation(state, health.DEFAULT_POLICY)[1]


def test_a_restored_port_recovers_only_after_proof_then_rise_and_hold_down():
    state = restored()
    state = health.observe_probe(state, "echo", echo("up"), 10.0, TIMERS)
    assert state.awaiting == () and state.verdict is Verdict.DOWN  # proof given, rise pending
    state = tick(state, 11.0)
    state = tick(state, 14.0)
    assert state.verdict is Verdict.DOWN  # hold-down (5 s from 10 s) not over
    state = tick(state, 15.5)
    assert state.verdict is Verdict.UP


def test_a_probe_that_says_down_again_keeps_the_port_down():
    state = restored()
    state = health.observe_probe(state, "echo", echo("down"), 10.0, TIMERS)
    for t in range(11, 30):
        state = tick(state, float(t))
    assert state.verdict is Verdict.DOWN


def test_restore_of_an_up_verdict_changes_nothing_and_a_dead_link_is_worse():
    state = health.initial(UP_SAMPLE, 0.0)
    assert health.restore(state, Verdict.UP, "x", ("echo",), 0.0) == state
    dead = health.initial(LinkSample(port="eth0", present=False), 0.0)
    assert health.restore(dead, Verdict.DEGRADED, "x", (), 0.0).verdict is Verdict.DOWN


def test_reset_signals_restart_holds_a_bad_verdict_and_drop_releases_it():
    state = health.initial(UP_SAMPLE, 0.0)
    state = health.observe_probe(state, "echo", echo("down"), 1.0, TIMERS)
    assert state.verdict is Verdict.DOWN
    restarted = health.reset_signals(state, restart={"echo"})
    assert restarted.awaiting == ("echo",) and dict(restarted.signals.probes) == {}
    # a new prober that has not answered yet: still DOWN after rise + hold-down
    for t in range(2, 20):
        restarted = tick(restarted, float(t))
    assert restarted.verdict is Verdict.DOWN
    # the probe is removed from the config: its evidence and the proof go
    dropped = health.reset_signals(restarted, drop={"echo"})
    assert dropped.awaiting == ()
    for t in range(20, 30):
        dropped = tick(dropped, float(t))
    assert dropped.verdict is Verdict.UP


def test_reset_signals_restart_of_a_good_signal_awaits_nothing():
    state = health.observe_probe(health.initial(UP_SAMPLE, 0.0), "echo", echo("up"), 1.0, TIMERS)
    assert health.reset_signals(state, restart={"echo", "optics"}).awaiting == ()


def test_verdict_file_round_trip_keeps_bad_ports_with_their_signals():
    doc = carried.encode({"eth0": (Verdict.DOWN, "echo: lost", ("echo",)),
                          "eth1": (Verdict.UP, "link healthy", ())}, written_at=1000.0)
    out = carried.decode(doc, now_wall=1090.0)
    assert set(out) == {"eth0"}
    assert out["eth0"].verdict is Verdict.DOWN and out["eth0"].awaiting == ("echo",)
    assert "90s ago" in out["eth0"].reason and "echo: lost" in out["eth0"].reason


@pytest.mark.parametrize("doc, words", [
    ({"format": 9}, "format"),
    ({"format": 1, "written_at": "x", "ports": {}}, "written_at"),
    ({"format": 1, "written_at": 1.0, "ports": []}, "ports"),
    ({"format": 1, "written_at": 1.0, "ports": {"eth0": {"verdict": "SIDEWAYS"}}}, "eth0.verdict"),
    ({"format": 1, "written_at": 1.0, "ports": {"eth0": {"verdict": "DOWN", "signals": "echo"}}},
     "eth0.signals"),
])
def test_a_verdict_file_we_did_not_write_is_named_not_trusted(doc, words):
    with pytest.raises(carried.CarriedError, match=words.replace(".", r"\.")):
        carried.decode(doc, 0.0)


def test_a_rail_table_on_a_backup_at_adoption_is_failed_over():
    config = rails_config(2)
    kernel = KernelState(
        nexthops=frozenset({Nexthop(1, "198.18.0.254", "eth0", 201),
                            Nexthop(2, "198.18.1.254", "eth1", 201)}),
        routes=frozenset({Route(10100, "0.0.0.0/0", 2, 201), Route(10101, "0.0.0.0/0", 2, 201)}))
    out = carried.failed_over(config, kernel)
    assert set(out) == {"eth0"} and "through eth1" in out["eth0"]
