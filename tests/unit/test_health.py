"""Port health state machine, driven with simulated time."""

import itertools

import pytest

from linkpassd.core import health
from linkpassd.core.health import TRANSITIONS, Relation
from linkpassd.core.model import LinkSample, Timers, Verdict

TIMERS = Timers(rise=3, fall=1, hold_down_s=5.0)


def up(port="eth0", downs=0):
    return LinkSample(port=port, present=True, ifindex=2, admin_up=True, carrier=True,
                      operstate="UP", carrier_up_count=downs + 1, carrier_down_count=downs)


def down(port="eth0", downs=1):
    return LinkSample(port=port, present=True, ifindex=2, admin_up=True, carrier=False,
                      operstate="LOWERLAYERDOWN", carrier_up_count=downs, carrier_down_count=downs)


def feed(state, samples, start, step, timers=TIMERS):
    now = start
    for s in samples:
        state = health.observe(state, s, now, timers)
        now += step
    return state, now


def test_transition_table_is_total():
    for verdict, relation in itertools.product(Verdict, Relation):
        assert (verdict, relation) in TRANSITIONS


def test_healthy_port_is_trusted_at_start():
    s = health.initial(up(), now=100.0)
    assert s.verdict is Verdict.UP and s.phase == "UP"


def test_port_down_at_start_is_down():
    s = health.initial(down(), now=100.0)
    assert s.verdict is Verdict.DOWN
    assert "no carrier" in s.reason


def test_carrier_loss_is_down_on_first_sample_with_fall_1():
    s = health.initial(up(), 0.0)
    s = health.observe(s, down(), 1.0, TIMERS)
    assert s.verdict is Verdict.DOWN and s.since == 1.0


def test_fall_count_delays_down_and_one_good_sample_forgives():
    t = Timers(rise=1, fall=3, hold_down_s=0.0)
    s = health.initial(up(), 0.0)
    s = health.observe(s, down(), 1.0, t)
    assert s.phase == "FAILING" and s.verdict is Verdict.UP
    s = health.observe(s, up(downs=1), 2.0, t)
    assert s.phase == "UP"
    s, _ = feed(s, [down(downs=2)] * 3, 3.0, 1.0, t)
    assert s.verdict is Verdict.DOWN


def test_recovery_needs_rise_count_and_hold_down():
    s = health.initial(up(), 0.0)
    s = health.observe(s, down(), 1.0, TIMERS)
    # carrier back at t=2; ticks every 0.5 s
    s = health.observe(s, up(downs=1), 2.0, TIMERS)
    assert s.phase == "RECOVERING" and s.verdict is Verdict.DOWN
    s, now = feed(s, [up(downs=1)] * 9, 2.5, 0.5)  # up to t=6.5: hold-down not done
    assert s.verdict is Verdict.DOWN
    s = health.observe(s, up(downs=1), 7.0, TIMERS)  # 5.0 s after carrier returned
    assert s.verdict is Verdict.UP and s.since == 7.0


def test_rise_count_alone_is_not_enough_and_hold_down_alone_is_not_enough():
    t = Timers(rise=5, fall=1, hold_down_s=1.0)
    s = health.initial(down(), 0.0)
    s = health.observe(s, up(downs=1), 10.0, t)
    s = health.observe(s, up(downs=1), 20.0, t)  # hold-down long done, 2/5 samples
    assert s.verdict is Verdict.DOWN
    s, _ = feed(s, [up(downs=1)] * 3, 21.0, 0.1, t)
    assert s.verdict is Verdict.UP


def test_bad_sample_during_recovery_restarts_hold_down():
    s = health.initial(down(), 0.0)
    s, now = feed(s, [up(downs=1)] * 8, 1.0, 0.5)  # t=1..4.5
    s = health.observe(s, down(downs=2), 4.6, TIMERS)
    assert s.phase == "DOWN"
    s, now = feed(s, [up(downs=2)] * 10, 4.7, 0.5)  # until 9.2 : 4.5 s good
    assert s.verdict is Verdict.DOWN
    s = health.observe(s, up(downs=2), 9.8, TIMERS)
    assert s.verdict is Verdict.UP


def test_unseen_flap_counts_as_a_failure():
    """The down counter moved but we never saw carrier drop (missed events)."""
    s = health.initial(up(downs=4), 0.0)
    s = health.observe(s, up(downs=5), 1.0, TIMERS)
    assert s.verdict is Verdict.DOWN and s.phase == "RECOVERING"
    assert "flapped unseen" in s.reason


def test_missing_and_admin_down_interfaces_are_bad():
    s = health.initial(up(), 0.0)
    s = health.observe(s, LinkSample.missing("eth0"), 1.0, TIMERS)
    assert s.verdict is Verdict.DOWN and s.reason == "no such port: the interface does not exist (missing, or renamed)"
    s2 = health.initial(LinkSample(port="eth0", present=True, admin_up=False, carrier=False), 0.0)
    assert "administratively down" in s2.reason


def test_port_state_reports_evidence_and_carrier():
    s = health.initial(up(), 0.0)
    s = health.observe(s, down(), 1.0, TIMERS)
    s = health.observe(s, up(downs=1), 2.0, TIMERS)
    ps = health.port_state(s, 3.0, TIMERS)
    assert ps.verdict is Verdict.DOWN and ps.carrier is True and ps.phase == "RECOVERING"
    assert any("hold-down 4.0s of 5.0s left" in e for e in ps.evidence)


@pytest.mark.parametrize("fall", [1, 2, 3])
def test_verdict_only_changes_after_fall_consecutive_bad_samples(fall):
    t = Timers(rise=1, fall=fall, hold_down_s=0.0)
    s = health.initial(up(), 0.0)
    verdicts = []
    for i in range(fall):
        s = health.observe(s, down(), float(i + 1), t)
        verdicts.append(s.verdict)
    assert verdicts == [Verdict.UP] * (fall - 1) + [Verdict.DOWN]
