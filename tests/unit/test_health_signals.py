"""Health from counters, optics and flap history, driven with simulated time."""

from __future__ import annotations

import math

from hypothesis import given, settings, strategies as st

from linkpassd.core import health, policy
from linkpassd.core.model import (CounterSample, LinkSample, ModuleIdentity, OpticsReading,
                                  Thresholds, Timers, Unreadable, Verdict)
from linkpassd.core.signals import HealthPolicy, theil_sen_slope

from corefixtures import rails_config

TIMERS = Timers(rise=3, fall=1, hold_down_s=5.0, tick_interval_s=0.5)
POLICY = HealthPolicy()
IDENTITY = ModuleIdentity(spec="CMIS", form_factor="QSFP-DD", vendor="LAB", part="P", serial="S")
RX_T = Thresholds(high_alarm=5.0, high_warn=3.0, low_warn=-10.0, low_alarm=-13.0)


def link(up=True, downs=0, port="eth0"):
    return LinkSample(port=port, present=True, ifindex=2, admin_up=True, carrier=up,
                      operstate="UP" if up else "DOWN", carrier_up_count=downs + int(up),
                      carrier_down_count=downs)


def optics(rx_dbm, lanes=4, flags=frozenset()):
    return OpticsReading(identity=IDENTITY, temperature_c=40.0, voltage_v=3.3,
                         tx_bias_ma=(6.0,) * lanes, tx_power_dbm=(0.0,) * lanes,
                         rx_power_dbm=(rx_dbm,) * lanes, thresholds=(("rx_power_dbm", RX_T),),
                         flags=frozenset(flags))


def counters(crc=0, fec_unc=0, port="eth0"):
    return CounterSample(port=port, rx_crc_errors=crc, fec_uncorrectable=fec_unc, fec_corrected=0)


def start(port="eth0"):
    return health.initial(link(port=port), 0.0)


# --------------------------------------------------------------------------
# Optics
# --------------------------------------------------------------------------


def decline(rate_db_per_s, until, step=2.0, thresholds=RX_T):
    """Feed RX power falling from -2 dBm; return (drain time, final state)."""
    s = start()
    t = 0.0
    while t < until:
        reading = optics(-2.0 - rate_db_per_s * t)
        reading = OpticsReading(**{**vars(reading), "thresholds": (("rx_power_dbm", thresholds),)})
        s = health.observe_optics(s, reading, t, TIMERS, POLICY)
        if s.verdict is Verdict.DEGRADED:
            return t, s
        t += step
    return None, s


def test_slow_rx_power_decline_drains_before_the_loss_point():
    """1.2 dB/min from -2 dBm: the receiver loses the signal at the module's low
    alarm (-13 dBm) at t=550 s; traffic must have left well before."""
    drained_at, s = decline(0.02, until=550)
    assert drained_at is not None and drained_at < 550 - 60, drained_at


def test_a_decline_the_trend_predicts_is_drained_before_the_warning_level():
    """12 dB/min: the warning (-10 dBm) comes at t=40 s, the alarm at t=55 s.
    The trend sees it coming and drains before the warning is even reached."""
    drained_at, s = decline(0.2, until=55)
    assert drained_at is not None and drained_at < 40, drained_at
    assert "low alarm -13 dBm in" in s.reason


def test_a_module_without_warning_levels_is_drained_by_the_trend_before_its_alarm():
    alarm_only = Thresholds(low_alarm=-13.0)
    drained_at, s = decline(0.2, until=55, thresholds=alarm_only)
    assert drained_at is not None and drained_at < 55 - 5, drained_at


def test_rx_power_below_the_module_warning_drains_after_confirmation():
    s = start()
    for i in range(2):
        s = health.observe_optics(s, optics(-11.0), float(i), TIMERS, POLICY)
        assert s.verdict is Verdict.UP  # 1 and 2 readings of 3
    s = health.observe_optics(s, optics(-11.0), 2.0, TIMERS, POLICY)
    assert s.verdict is Verdict.DEGRADED and "below low warning -10" in s.reason


def test_margin_from_config_raises_the_warning_level():
    strict = HealthPolicy(rx_power_margin_db=2.0)
    s = start()
    for i in range(3):
        s = health.observe_optics(s, optics(-9.0), float(i), TIMERS, strict)
    assert s.verdict is Verdict.DEGRADED
    s = start()
    for i in range(3):
        s = health.observe_optics(s, optics(-9.0), float(i), TIMERS, POLICY)
    assert s.verdict is Verdict.UP


@settings(max_examples=200, deadline=None)
@given(spikes=st.sets(st.integers(0, 99), max_size=30), depth=st.floats(-40, -14),
       noise=st.lists(st.floats(-0.3, 0.3), min_size=100, max_size=100))
def test_random_single_sample_spikes_cause_no_drain(spikes, depth, noise):
    """Readings at -3 dBm with noise; any set of *isolated* readings replaced
    by a spike far below the alarm. Never drained."""
    isolated = {i for i in spikes if i - 1 not in spikes}
    s = start()
    for i in range(100):
        rx = depth if i in isolated else -3.0 + noise[i]
        s = health.observe_optics(s, optics(rx), i * 2.0, TIMERS, POLICY)
        s = health.observe(s, link(), i * 2.0 + 1.0, TIMERS, POLICY)  # ticks re-evaluate too
        assert s.verdict is Verdict.UP, f"drained at reading {i}: {s.reason}"


def test_optics_recover_only_after_rise_and_hold_down():
    s = start()
    t = 0.0
    for _ in range(3):
        s = health.observe_optics(s, optics(-11.5), t, TIMERS, POLICY)
        t += 1.0
    assert s.verdict is Verdict.DEGRADED
    back = t
    s = health.observe_optics(s, optics(-3.0), t, TIMERS, POLICY)
    while t < back + 4.5:
        t += 0.5
        s = health.observe(s, link(), t, TIMERS, POLICY)
        assert s.verdict is Verdict.DEGRADED and s.phase == "RECOVERING"
    t = back + 5.0
    s = health.observe(s, link(), t, TIMERS, POLICY)
    assert s.verdict is Verdict.UP


def test_unreadable_optics_is_a_verdict_of_its_own_and_moves_nothing():
    s = start()
    s = health.observe_optics(s, Unreadable("page 11h truncated at 64 bytes"), 1.0, TIMERS, POLICY)
    assert s.verdict is Verdict.UP
    ps = health.port_state(s, 1.0, TIMERS, POLICY)
    assert any("optics: unreadable: page 11h truncated" in e for e in ps.evidence)


def test_module_fault_flags_degrade():
    s = start()
    for i in range(3):
        s = health.observe_optics(s, optics(-3.0, flags={"tx_fault[1]"}), float(i), TIMERS, POLICY)
    assert s.verdict is Verdict.DEGRADED and "tx_fault[1]" in s.reason


def test_theil_sen_ignores_one_outlier():
    points = [(float(t), -2.0 - 0.01 * t) for t in range(20)]
    points[10] = (10.0, -40.0)
    assert math.isclose(theil_sen_slope(points), -0.01, rel_tol=1e-6)


# --------------------------------------------------------------------------
# Counters
# --------------------------------------------------------------------------


def test_sustained_crc_errors_drain_after_confirmed_intervals():
    s = start()
    crc = 0
    for i in range(6):
        crc += 50  # 50/s for 1 s intervals, limit 10/s
        s = health.observe_counters(s, counters(crc=crc), float(i), TIMERS, POLICY)
        if i < 3:  # first reading has no interval; then 1, 2 of 3 intervals
            assert s.verdict is Verdict.UP
    assert s.verdict is Verdict.DEGRADED and "rx_crc_errors" in s.reason


def test_one_burst_of_errors_is_not_a_sustained_rate():
    s = start()
    crc = 0
    for i in range(30):
        crc += 5000 if i == 10 else 0
        s = health.observe_counters(s, counters(crc=crc), float(i), TIMERS, POLICY)
        assert s.verdict is Verdict.UP


def test_uncorrectable_fec_drains():
    s = start()
    for i in range(5):
        s = health.observe_counters(s, counters(fec_unc=3 * i), float(i), TIMERS, POLICY)
    assert s.verdict is Verdict.DEGRADED and "fec_uncorrectable" in s.reason


def test_counter_reset_and_implausible_jumps_are_not_link_faults():
    s = start()
    s = health.observe_counters(s, counters(crc=1000), 0.0, TIMERS, POLICY)
    s = health.observe_counters(s, counters(crc=10), 1.0, TIMERS, POLICY)  # driver reset
    assert "reset" in s.signals.counters.last.detail
    s = health.observe_counters(s, counters(crc=10 + 2**62), 2.0, TIMERS, POLICY)
    assert s.signals.counters.last.status == "unreadable" and "implausible" in s.signals.counters.last.detail
    s = health.observe_counters(s, counters(crc=-5), 3.0, TIMERS, POLICY)
    assert s.verdict is Verdict.UP


def test_driver_without_counters_is_unsupported_not_unhealthy():
    s = start()
    for i in range(5):
        s = health.observe_counters(s, CounterSample(port="eth0"), float(i), TIMERS, POLICY)
    assert s.verdict is Verdict.UP and s.signals.counters.last.status == "unsupported"


counter_value = st.one_of(st.none(), st.integers(-2**64, 2**64))


@settings(max_examples=300, deadline=None)
@given(seq=st.lists(st.tuples(st.floats(0.001, 100), counter_value, counter_value, counter_value,
                              counter_value, st.booleans()), min_size=1, max_size=40))
def test_random_counter_sequences_never_raise_and_verdicts_stay_in_their_states(seq):
    s = start()
    t = 0.0
    for dt, crc, sym, unc, cor, carrier in seq:
        t += dt
        s = health.observe_counters(s, CounterSample(port="eth0", rx_crc_errors=crc, symbol_errors=sym,
                                                     fec_uncorrectable=unc, fec_corrected=cor),
                                    t, TIMERS, POLICY)
        s = health.observe(s, link(up=carrier), t, TIMERS, POLICY)
        assert s.verdict in set(Verdict)
        ps = health.port_state(s, t, TIMERS, POLICY)
        assert ps.phase in {"UP", "DEGRADED", "DOWN", "FAILING", "RECOVERING"}


# --------------------------------------------------------------------------
# Flaps
# --------------------------------------------------------------------------


def routing_of(cfg, ports):
    """What moves traffic: routes and group members. Nexthop objects follow
    carrier (the kernel deletes them; linkpassd re-creates them while the port
    recovers) without changing any path."""
    desired = policy.decide(cfg, ports).desired
    return desired.routes, desired.groups


def test_five_flaps_in_two_seconds_give_at_most_two_routing_changes():
    """Each flap is 0.2 s down, 0.2 s up, ticks every 0.1 s; then the link
    stays up. Count how often the host's desired routing changes."""
    cfg = rails_config(2)
    timers = Timers(rise=3, fall=1, hold_down_s=5.0, tick_interval_s=0.1)
    states = {"eth0": start("eth0"), "eth1": start("eth1")}
    desired = [routing_of(cfg, {p: health.port_state(h, 0.0, timers) for p, h in states.items()})]
    returned_at = None
    downs = 0
    t = 0.0
    while t < 120.0:
        t = round(t + 0.1, 6)
        phase = t % 0.4
        flapping = t < 2.0
        up = not (flapping and phase < 0.2)
        if not up and (states["eth0"].last.healthy):
            downs += 1
        states["eth0"] = health.observe(states["eth0"], link(up, downs, "eth0"), t, timers)
        states["eth1"] = health.observe(states["eth1"], link(True, 0, "eth1"), t, timers)
        now = routing_of(cfg, {p: health.port_state(h, t, timers) for p, h in states.items()})
        if now != desired[-1]:
            desired.append(now)
            if states["eth0"].verdict is Verdict.UP:
                returned_at = t
    assert downs == 5
    changes = len(desired) - 1
    assert 1 <= changes <= 2, f"{changes} routing changes"
    assert returned_at is not None, "never returned to the flapping port"
    assert returned_at >= 2.0 + timers.hold_down_s  # stable through the hold-down first


def test_chronic_flapping_is_suppressed_beyond_the_hold_down_then_reused():
    timers = Timers(rise=1, fall=1, hold_down_s=1.0)
    s = start()
    t = 0.0
    for k in range(4):  # 4 flaps in 4 s: penalty ~3600 > suppress 2500
        s = health.observe(s, link(False, k + 1), t, timers)
        s = health.observe(s, link(True, k + 1), t + 0.5, timers)
        t += 1.0
    t += 2.0
    s = health.observe(s, link(True, 4), t, timers)
    assert s.verdict is Verdict.DEGRADED and "flapping" in s.reason  # hold-down alone would be UP
    while s.verdict is not Verdict.UP and t < 200:
        t += 1.0
        s = health.observe(s, link(True, 4), t, timers)
    # penalty ~3600 decays to the reuse level 800 after ~15 s x log2(4.5) ~ 33 s
    assert 20 < t < 60, t
    assert s.signals.flaps.suppressed is False
