"""Health from counters, optics and flap history, driven with simulated time."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corefixtures import rails_config
from linkpassd.core import health, policy, signals
from linkpassd.core.model import (
    CounterSample,
    LinkSample,
    ModuleIdentity,
    OpticsReading,
    Thresholds,
    Timers,
    Unreadable,
    Verdict,
)
from linkpassd.core.signals import HealthPolicy, judge_optics, theil_sen_slope

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


# --------------------------------------------------------------------------
# Optics: the module's own flags next to its values (one severity rule)
# --------------------------------------------------------------------------

FULL_T = (
    ("temperature_c", Thresholds(high_alarm=75.0, high_warn=70.0, low_warn=0.0, low_alarm=-5.0)),
    ("voltage_v", Thresholds(high_alarm=3.6, high_warn=3.5, low_warn=3.1, low_alarm=3.0)),
    ("tx_bias_ma", Thresholds(high_alarm=13.0, high_warn=12.0, low_warn=4.0, low_alarm=3.0)),
    ("tx_power_dbm", Thresholds(high_alarm=4.0, high_warn=3.0, low_warn=-6.0, low_alarm=-8.0)),
    ("rx_power_dbm", RX_T),
)
FINE = {"temperature_c": 40.0, "voltage_v": 3.3, "tx_bias_ma": 7.0, "tx_power_dbm": 0.0,
        "rx_power_dbm": -3.0}


def module(flags=(), thresholds=FULL_T, **values) -> OpticsReading:
    """A 4-lane module reading fine values (unless given) against FULL_T."""
    v = {**FINE, **values}
    lane = {q: (v[q],) * 4 if not isinstance(v[q], tuple) else v[q]
            for q in ("tx_bias_ma", "tx_power_dbm", "rx_power_dbm")}
    return OpticsReading(identity=IDENTITY, temperature_c=v["temperature_c"], voltage_v=v["voltage_v"],
                         thresholds=thresholds, flags=frozenset(flags), **lane)


def judge(reading):
    return judge_optics(reading, (), POLICY)


ALARM_FLAGS = ["rx_los[2]", "rx_power_low_alarm[2]", "rx_power_high_alarm[0]", "tx_power_low_alarm[1]",
               "tx_power_high_alarm[3]", "tx_bias_low_alarm[0]", "tx_bias_high_alarm[0]",
               "temperature_high_alarm", "temperature_low_alarm", "voltage_low_alarm",
               "voltage_high_alarm", "tx_fault[0]", "tx_los[1]", "module_fault",
               "module_firmware_fault", "datapath_firmware_fault"]


@pytest.mark.parametrize("flag", ALARM_FLAGS)
def test_an_alarm_flag_degrades_a_module_whose_values_are_fine(flag):
    assert judge(module()).severity is Verdict.UP
    a = judge(module(flags={flag}))
    assert (a.severity, a.status) == (Verdict.DEGRADED, "degraded")
    assert f"module flags {flag}" in a.detail


def test_rx_los_with_fine_rx_power_drains_the_port_after_confirmation():
    s = start()
    for i in range(3):
        assert s.verdict is Verdict.UP
        s = health.observe_optics(s, module(flags={"rx_los[1]", "rx_power_low_alarm[1]"}),
                                  float(i), TIMERS, POLICY)
    assert s.verdict is Verdict.DEGRADED
    assert "module flags rx_los[1], rx_power_low_alarm[1]" in s.reason


@pytest.mark.parametrize("flag, severity", [
    ("rx_power_low_warning[1]", Verdict.DEGRADED),  # the RX floor, as for values
    ("rx_power_high_warning[1]", Verdict.UP),
    ("tx_power_low_warning[0]", Verdict.UP),
    ("tx_bias_high_warning[0]", Verdict.UP),
    ("temperature_high_warning", Verdict.UP),
    ("voltage_low_warning", Verdict.UP)])
def test_a_warning_flag_is_judged_like_a_value_past_the_warning(flag, severity):
    a = judge(module(flags={flag}))
    assert a.severity is severity and flag in a.detail


# A value just past each level, for each quantity and side
PAST = {("temperature_c", "high"): (72.0, 80.0), ("temperature_c", "low"): (-1.0, -9.0),
        ("voltage_v", "high"): (3.55, 3.7), ("voltage_v", "low"): (3.05, 2.9),
        ("tx_bias_ma", "high"): (12.5, 14.0), ("tx_bias_ma", "low"): (3.5, 2.0),
        ("tx_power_dbm", "high"): (3.5, 5.0), ("tx_power_dbm", "low"): (-7.0, -9.0),
        ("rx_power_dbm", "high"): (4.0, 6.0), ("rx_power_dbm", "low"): (-11.0, -14.0)}
FLAG_NAME = {"temperature_c": "temperature", "voltage_v": "voltage", "tx_bias_ma": "tx_bias",
             "tx_power_dbm": "tx_power", "rx_power_dbm": "rx_power"}


@pytest.mark.parametrize("quantity, side", sorted(PAST))
@pytest.mark.parametrize("level", ["warning", "alarm"])
def test_values_and_flags_follow_one_severity_rule(quantity, side, level):
    value = PAST[(quantity, side)][level == "alarm"]
    lanes = quantity in ("tx_bias_ma", "tx_power_dbm", "rx_power_dbm")
    flag = f"{FLAG_NAME[quantity]}_{side}_{level}" + ("[0]" if lanes else "")
    by_value = judge(module(**{quantity: value}))
    by_flag = judge(module(flags={flag}))
    want = Verdict.DEGRADED if level == "alarm" or (quantity, side) == ("rx_power_dbm", "low") else None
    assert signals.level_severity(quantity, side, level) is want
    assert by_value.severity is by_flag.severity is (want or Verdict.UP)  # a note leaves it UP
    where = "below" if side == "low" else "above"
    assert f"{where} {side} {level}" in by_value.detail and flag in by_flag.detail


@pytest.mark.parametrize("quantity, level, at, flag, flagged", [
    # exactly at the high alarm, no flag: past the warning only -> a note; the flag makes it an alarm
    ("temperature_c", "high_alarm", 75.0, "temperature_high_alarm", Verdict.DEGRADED),
    # exactly at the RX low warning, no flag: within; with the module's warning flag: the RX floor
    ("rx_power_dbm", "low_warn", -10.0, "rx_power_low_warning[0]", Verdict.DEGRADED),
    # exactly at the TX bias high warning: within; the warning flag is a note
    ("tx_bias_ma", "high_warn", 12.0, "tx_bias_high_warning[0]", Verdict.UP),
])
def test_a_value_exactly_at_a_level_is_not_past_it_and_the_module_flag_decides(
        quantity, level, at, flag, flagged):
    t = dict(FULL_T)[quantity]
    assert getattr(t, level) == at
    unflagged = judge(module(**{quantity: at}))
    assert unflagged.severity is Verdict.UP
    assert ("above high warning" in unflagged.detail) == (level == "high_alarm")
    assert signals.past_level(at, t) == (("high", "warning", 70.0) if level == "high_alarm" else None)
    flagged_a = judge(module(flags={flag}, **{quantity: at}))
    assert flagged_a.severity is flagged and flag in flagged_a.detail


BLANK = Thresholds(8.1647, 8.1647, 8.1647, 8.1647)  # a page of 0xFF, decoded


def test_unreadable_rx_thresholds_judge_no_values_but_say_so():
    t = tuple((q, BLANK if q == "rx_power_dbm" else th) for q, th in FULL_T)
    a = judge(module(thresholds=t))  # RX -3 dBm would be "below low alarm 8.1647"
    assert (a.severity, a.status) == (Verdict.UP, "thresholds unreadable")
    assert "thresholds unreadable: rx_power_dbm (all four levels 8.1647)" in a.detail
    assert "below" not in a.detail


def test_unreadable_thresholds_never_drain_but_flags_still_count():
    blank = tuple((q, BLANK) for q, _ in FULL_T)
    s = start()
    for i in range(5):
        s = health.observe_optics(s, module(thresholds=blank), float(i), TIMERS, POLICY)
    assert s.verdict is Verdict.UP
    a = s.signals.optics.last
    assert (a.severity, a.status) == (None, "thresholds unreadable")  # nothing judged
    ps = health.port_state(s, 5.0, TIMERS, POLICY)
    assert any(e.startswith("optics: thresholds unreadable:") for e in ps.evidence)
    flagged = judge(module(thresholds=blank, flags={"rx_los[0]"}))
    assert flagged.severity is Verdict.DEGRADED
    assert "rx_los[0]" in flagged.detail and "thresholds unreadable" in flagged.detail


def test_unreadable_rx_thresholds_feed_no_trend():
    drained_at, s = decline(0.2, until=55, thresholds=Thresholds(-13.0, -13.0, -13.0, -13.0))
    assert drained_at is None
    assert "thresholds unreadable" in s.signals.optics.last.detail


def test_equal_warning_and_alarm_levels_are_still_thresholds():
    t = Thresholds(high_alarm=3.0, high_warn=3.0, low_warn=-13.0, low_alarm=-13.0)
    assert not signals.thresholds_unreadable(t)
    a = judge(module(rx_power_dbm=-14.0, thresholds=(("rx_power_dbm", t),)))
    assert a.severity is Verdict.DEGRADED and "below low alarm -13" in a.detail


PASSIVE = OpticsReading(identity=IDENTITY, tx_bias_ma=(None,) * 4, tx_power_dbm=(None,) * 4,
                        rx_power_dbm=(None,) * 4)


@pytest.mark.parametrize("reading", [
    PASSIVE,
    OpticsReading(identity=IDENTITY),  # CMIS flat memory: no lanes at all
    OpticsReading(identity=IDENTITY, temperature_c=35.5, rx_power_dbm=(None,) * 4),  # flat QSFP
], ids=["no-lane-values", "no-lanes", "flat-with-temperature"])
def test_a_passive_module_has_no_opinion_not_ok(reading):
    a = judge(reading)
    assert (a.severity, a.status) == (None, "no monitors (passive)")
    assert signals.is_passive(reading)
    s = health.observe_optics(start(), reading, 1.0, TIMERS, POLICY)
    assert s.verdict is Verdict.UP
    ps = health.port_state(s, 1.0, TIMERS, POLICY)
    assert any(e.startswith("optics: no monitors (passive)") for e in ps.evidence)


def test_a_passive_module_in_module_fault_is_degraded_and_still_called_passive():
    a = judge(OpticsReading(identity=IDENTITY, flags=frozenset({"module_fault"})))
    assert a.severity is Verdict.DEGRADED
    assert "module flags module_fault" in a.detail and "no monitors (passive)" in a.detail


def test_flags_not_judged_are_named_and_odd_names_never_raise():
    a = judge(module(flags={"rx_cdr_lol[1]", "tx_adaptive_eq_fault[0]", "", "rx_los[x]",
                            "weird flag"}))
    assert a.severity is Verdict.UP
    assert "module also flags" in a.detail and "rx_cdr_lol[1]" in a.detail


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
