"""Health signals beyond carrier: interface counters, optics, flap history.

Each signal keeps a short history and judges it into an `Assessment`: a
severity (None when it has no opinion: unsupported, unreadable, too little
data) with the evidence in words. Judgements are debounced *per signal, per
reading*: a severity counts only once `confirm` consecutive readings of that
signal agree, so one spiky reading, however often the daemon re-evaluates it,
drains nothing. Alibaba's HPN abandoned cross-rail rerouting because noisy
monitoring caused false reroutes; this module is where that is prevented.

Pure: readings and `now` in, judgements out.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from linkpassd.core.model import Assessment, CounterSample, HealthPolicy, OpticsReading, Thresholds, Unreadable, Verdict

COUNTER_FIELDS = ("rx_crc_errors", "symbol_errors", "fec_uncorrectable", "fec_corrected")
# A counter that moves faster than this per second is a sensor glitch, not a link.
IMPLAUSIBLE_RATE = 1e12
# RX power readings over time: (t, dBm per lane, None where a lane is not reported).
RxHistory = Sequence[tuple[float, Sequence[float | None]]]


def _worse(a: Verdict | None, b: Verdict | None) -> Verdict | None:
    rank = {None: -1, Verdict.UP: 0, Verdict.DEGRADED: 1, Verdict.DOWN: 2}
    return a if rank[a] >= rank[b] else b


def worst(*verdicts: Verdict | None) -> Verdict | None:
    out: Verdict | None = None
    for v in verdicts:
        out = _worse(out, v)
    return out


# --------------------------------------------------------------------------
# Interface counters: rates over a window, confirmed by sustained intervals
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class CounterHistory:
    samples: tuple[tuple[float, CounterSample], ...] = ()
    bad_intervals: tuple[float, ...] = ()  # ends of intervals whose rate crossed a threshold
    last: Assessment = Assessment("counters", None, "warming up", "no counter readings yet")

    def observe(self, sample: CounterSample, now: float, policy: HealthPolicy) -> "CounterHistory":
        """Add a reading and judge. Counters that go backwards (driver reset)
        restart the window; implausible jumps are discarded as glitches."""
        if self.samples:
            t_prev, prev = self.samples[-1]
            dt = now - t_prev
            if dt <= 0:
                return self
            glitch = _glitch(prev, sample, dt)
            if glitch == "reset":
                return CounterHistory(samples=((now, sample),), last=Assessment(
                    "counters", None, "warming up", "counters went backwards (reset); window restarted"))
            if glitch:
                return replace(self, last=Assessment("counters", None, "unreadable", glitch))
            crossed = _interval_crossings(prev, sample, dt, policy)
        else:
            crossed = []
        window_start = now - policy.counter_window_s
        samples = tuple(s for s in self.samples if s[0] >= window_start) + ((now, sample),)
        bad = tuple(t for t in self.bad_intervals if t >= window_start)
        if crossed:
            bad += (now,)
        return CounterHistory(samples=samples, bad_intervals=bad,
                              last=_judge_counters(samples, bad, crossed, policy))


def _glitch(prev: CounterSample, cur: CounterSample, dt: float) -> str:
    for name in COUNTER_FIELDS:
        a, b = getattr(prev, name), getattr(cur, name)
        if a is None or b is None:
            continue
        if b < 0:
            return f"{name} reads negative ({b})"
        if b < a:
            return "reset"
        if (b - a) / dt > IMPLAUSIBLE_RATE:
            return f"{name} jumped by {b - a} in {dt:.1f}s (implausible)"
    return ""


def _limits(policy: HealthPolicy) -> dict[str, float | None]:
    return {"rx_crc_errors": policy.crc_errors_per_s, "symbol_errors": policy.symbol_errors_per_s,
            "fec_uncorrectable": policy.fec_uncorrectable_per_s,
            "fec_corrected": policy.fec_corrected_per_s}


def _interval_crossings(prev: CounterSample, cur: CounterSample, dt: float,
                        policy: HealthPolicy) -> list[str]:
    out = []
    for name, limit in _limits(policy).items():
        a, b = getattr(prev, name), getattr(cur, name)
        if limit is not None and a is not None and b is not None and (b - a) / dt > limit:
            out.append(name)
    return out


def _judge_counters(samples: Sequence[tuple[float, CounterSample]], bad: Sequence[float],
                    crossed: Sequence[str], policy: HealthPolicy) -> Assessment:
    (t0, first), (t1, last) = samples[0], samples[-1]
    supported = [n for n in COUNTER_FIELDS if getattr(last, n) is not None]
    if not supported:
        return Assessment("counters", None, "unsupported", "driver reports no error counters")
    if t1 - t0 <= 0:
        return Assessment("counters", None, "warming up", "one reading so far")
    rates = {n: (getattr(last, n) - getattr(first, n)) / (t1 - t0) for n in supported
             if getattr(first, n) is not None}
    limits = _limits(policy)
    over = {n: r for n, r in rates.items() if limits[n] is not None and r > limits[n]}
    text = ", ".join(f"{n} {r:.3g}/s" for n, r in sorted(rates.items()))
    window = f"over {t1 - t0:.0f}s"
    if over and len(bad) >= policy.confirm:
        detail = "; ".join(f"{n} {r:.3g}/s > {limits[n]:g}/s" for n, r in sorted(over.items()))
        return Assessment("counters", Verdict.DEGRADED, "degraded",
                          f"{detail} {window}, in {len(bad)} intervals")
    if over:
        return Assessment("counters", Verdict.DEGRADED, "degraded", f"{text} {window}; "
                          f"{len(bad)} of {policy.confirm} intervals needed", confirmed=False)
    return Assessment("counters", Verdict.UP, "ok", f"{text} {window}")


# --------------------------------------------------------------------------
# Optics: the module's own levels and flags, and the RX power trend
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class OpticsHistory:
    rx: tuple[tuple[float, tuple[float | None, ...]], ...] = ()  # (t, rx dBm per lane)
    streak: int = 0  # consecutive degraded readings
    last: Assessment = Assessment("optics", None, "warming up", "no optics readings yet")
    reading: OpticsReading | Unreadable | None = None

    def observe(self, reading: OpticsReading | Unreadable, now: float,
                policy: HealthPolicy) -> "OpticsHistory":
        if isinstance(reading, Unreadable):
            return replace(self, reading=reading, streak=0, last=Assessment(
                "optics", None, "unreadable", reading.reason))
        rx = tuple(self.rx) + ((now, tuple(reading.rx_power_dbm)),)
        rx = tuple(p for p in rx if p[0] >= now - policy.trend_window_s)
        judged = judge_optics(reading, rx, policy)
        streak = self.streak + 1 if judged.severity is Verdict.DEGRADED else 0
        confirmed = judged.severity is not Verdict.DEGRADED or streak >= policy.confirm
        if not confirmed:
            judged = replace(judged, confirmed=False,
                             detail=f"{judged.detail} ({streak} of {policy.confirm} readings)")
        return OpticsHistory(rx=rx, streak=streak, last=judged, reading=reading)


# The module's own flags (linkpassd.adapters.optics names them) are evidence
# next to its values, judged by the same rule (`level_severity`).  These say
# that a lane or the whole module is not working: alarm-level, whatever the
# values read (a module can report fine RX power and RX LOS at once).
FAULT_FLAGS = ("tx_fault", "tx_los", "rx_los", "module_fault", "module_firmware_fault",
               "datapath_firmware_fault")
# flag name prefix -> the reading's field
FLAG_QUANTITIES = {"temperature": "temperature_c", "voltage": "voltage_v",
                   "tx_bias": "tx_bias_ma", "tx_power": "tx_power_dbm", "rx_power": "rx_power_dbm"}
_UNITS = {"temperature_c": "C", "voltage_v": "V", "tx_bias_ma": "mA", "tx_power_dbm": "dBm",
          "rx_power_dbm": "dBm"}
_LANE_QUANTITIES = ("tx_bias_ma", "tx_power_dbm", "rx_power_dbm")
_LEVEL_FLAG = re.compile(r"(temperature|voltage|tx_bias|tx_power|rx_power)_(high|low)_(alarm|warning)"
                         r"(?:\[(\d+)\])?")
_FAULT_FLAG = re.compile(r"(" + "|".join(FAULT_FLAGS) + r")(?:\[(\d+)\])?")


def level_severity(quantity: str, side: str, level: str) -> Verdict | None:
    """What being past one of the module's levels means, for a value and for
    the module's flag alike: past an alarm level (either side) degrades; past a
    warning level is a note, except RX power below its low warning, which is
    the RX floor (traffic leaves before the receiver loses the signal)."""
    if level == "alarm" or (quantity == "rx_power_dbm" and side == "low"):
        return Verdict.DEGRADED
    return None


def thresholds_unreadable(t: Thresholds) -> bool:
    """All four levels given and equal: a blank (all 0x00 / all 0xFF) or
    unprogrammed threshold block, not levels anything can be judged against."""
    levels = (t.high_alarm, t.high_warn, t.low_warn, t.low_alarm)
    return all(v is not None for v in levels) and len(set(levels)) == 1


def _given(t: Thresholds) -> bool:
    return any(v is not None for v in (t.high_alarm, t.high_warn, t.low_warn, t.low_alarm))


def is_passive(reading: OpticsReading) -> bool:
    """No lane monitors and no thresholds: a flat-memory module (passive
    copper, DAC) or one without DOM. Its silence is no evidence of health."""
    lanes = (*reading.tx_bias_ma, *reading.tx_power_dbm, *reading.rx_power_dbm)
    return (all(v is None for v in lanes)
            and not any(_given(reading.threshold(q)) for q in _UNITS))


def past_level(value: float, t: Thresholds, floor_margin: float = 0.0) -> tuple[str, str, float] | None:
    """(side, level, the level's value) that `value` is strictly past, worst
    first; None when within.  A value exactly at a level is not past it: at
    the boundary the module's own flag decides (it is judged as evidence too).
    `floor_margin` raises the low warning (RX power: policy margin); with no
    low warning the floor is the low alarm plus the margin."""
    if t.low_alarm is not None and value < t.low_alarm:
        return "low", "alarm", t.low_alarm
    if t.high_alarm is not None and value > t.high_alarm:
        return "high", "alarm", t.high_alarm
    floor = t.low_warn if t.low_warn is not None else (t.low_alarm if floor_margin else None)
    if floor is not None and value < floor + floor_margin:
        return "low", "warning", floor
    if t.high_warn is not None and value > t.high_warn:
        return "high", "warning", t.high_warn
    return None


def _judge_flags(flags: Iterable[str], problems: list[str], notes: list[str]) -> None:
    """The module's flags into problems (degrading) and notes, named as read."""
    degrading: list[str] = []
    warnings: list[str] = []
    other: list[str] = []
    for flag in sorted(flags):
        level = _LEVEL_FLAG.fullmatch(flag)
        if _FAULT_FLAG.fullmatch(flag):
            degrading.append(flag)
        elif level:
            quantity = FLAG_QUANTITIES[level.group(1)]
            severity = level_severity(quantity, level.group(2), level.group(3))
            (degrading if severity is Verdict.DEGRADED else warnings).append(flag)
        else:
            other.append(flag)
    if degrading:
        problems.append("module flags " + ", ".join(degrading))
    if warnings:
        notes.append("module warns " + ", ".join(warnings))
    if other:
        notes.append("module also flags " + ", ".join(other))


def judge_optics(reading: OpticsReading, rx_history: RxHistory, policy: HealthPolicy) -> Assessment:
    """The module's values against its own levels, its flags, and the RX trend.
    Thresholds whose four levels are equal are unreadable: values are not
    judged against them (the flags still are), and the detail says so."""
    problems: list[str] = []
    notes: list[str] = []
    _judge_flags(reading.flags, problems, notes)
    unreadable, judged_any = [], False
    for quantity, unit in _UNITS.items():
        t = reading.threshold(quantity)
        raw = getattr(reading, quantity)
        values = raw if isinstance(raw, tuple) else (raw,)
        if thresholds_unreadable(t):
            unreadable.append(f"{quantity} (all four levels {t.high_alarm:g})")
            continue
        if not _given(t) or all(v is None for v in values):
            continue
        judged_any = True
        margin = policy.rx_power_margin_db if quantity == "rx_power_dbm" else 0.0
        past: dict[tuple[str, str, float], list[tuple[int, float]]] = {}
        for lane, v in enumerate(values):
            where = None if v is None else past_level(v, t, margin)
            if where is not None:
                past.setdefault(where, []).append((lane, v))
        for (side, level, at), lanes in past.items():
            text = _past_text(quantity, unit, side, level, at, margin, lanes)
            (problems if level_severity(quantity, side, level) else notes).append(text)
    rx_t = reading.threshold("rx_power_dbm")
    if rx_t.low_alarm is not None and not thresholds_unreadable(rx_t):
        for lane in range(len(reading.rx_power_dbm)):
            eta = _time_to_alarm(rx_history, lane, rx_t.low_alarm, policy)
            if eta is not None:
                problems.append(eta)
    passive = is_passive(reading)
    passive_text = "no lane monitors or thresholds (flat memory, passive copper or no DOM)"
    if passive and problems:
        notes.insert(0, f"no monitors (passive): {passive_text}")
    elif (rx_t.low_warn is None and rx_t.low_alarm is None and reading.rx_power_dbm
          and not thresholds_unreadable(rx_t)):
        notes.append("module gives no RX power thresholds")
    if unreadable:
        notes.append("thresholds unreadable: " + ", ".join(unreadable)
                     + "; values not judged against them, module flags still count")
    if problems:
        return Assessment("optics", Verdict.DEGRADED, "degraded", "; ".join(problems + notes))
    if passive:
        return Assessment("optics", None, "no monitors (passive)", "; ".join([passive_text] + notes))
    rx_text = "RX " + "/".join("-" if v is None else f"{v:.2f}" for v in reading.rx_power_dbm) + " dBm"
    if unreadable:
        return Assessment("optics", Verdict.UP if judged_any else None, "thresholds unreadable",
                          "; ".join([rx_text] + notes))
    return Assessment("optics", Verdict.UP, "ok", "; ".join([rx_text] + notes))


def _past_text(quantity: str, unit: str, side: str, level: str, at: float, margin: float,
               lanes: list[tuple[int, float]]) -> str:
    where = "below" if side == "low" else "above"
    name = f"{side} {level} {at:g}" + (f"+{margin:g}" if side == "low" and level == "warning"
                                          and margin else "")
    if quantity == "rx_power_dbm":  # the signal operators read first: lanes and dBm
        return (f"{_lanes(lanes)} RX {'/'.join(f'{v:.2f}' for _, v in lanes)} dBm {where} {name}")
    lane_text = f"{_lanes(lanes)} " if quantity in _LANE_QUANTITIES else ""
    return f"{lane_text}{quantity} {'/'.join(f'{v:g}' for _, v in lanes)}{unit} {where} {name}"


def _lanes(lanes: list[tuple[int, float]]) -> str:
    idx = [i for i, _ in lanes]
    if len(idx) == 1:
        return f"lane {idx[0]}"
    if idx == list(range(idx[0], idx[-1] + 1)):
        return f"lanes {idx[0]}-{idx[-1]}"
    return "lanes " + ",".join(map(str, idx))


def theil_sen_slope(points: list[tuple[float, float]]) -> float:
    """Median of pairwise slopes: a trend that one outlier cannot bend."""
    slopes = [(y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(points)
              for (x2, y2) in points[i + 1:] if x2 != x1]
    return statistics.median(slopes) if slopes else 0.0


def _time_to_alarm(rx_history: RxHistory, lane: int, alarm: float, policy: HealthPolicy) -> str | None:
    points = [(t, x) for t, v in rx_history if lane < len(v) and (x := v[lane]) is not None
              and math.isfinite(x)]
    if len(points) < policy.trend_min_samples:
        return None
    span = points[-1][0] - points[0][0]
    if span < policy.trend_window_s / 2:
        return None
    slope = theil_sen_slope(points)
    if slope >= 0:
        return None
    third = max(1, len(points) // 3)
    early = statistics.median(v for _, v in points[:third])
    late = statistics.median(v for _, v in points[-third:])
    if early - late < policy.trend_min_drop_db:
        return None
    eta = (late - alarm) / -slope
    if eta > policy.predict_horizon_s:
        return None
    return (f"lane {lane} RX falling {-slope * 60:.2f} dB/min, {early - late:.1f} dB in "
            f"{span:.0f}s: low alarm {alarm:g} dBm in ~{max(eta, 0):.0f}s")


# --------------------------------------------------------------------------
# Flap dampening
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class FlapDamper:
    """A penalty per carrier loss that halves every `flap_half_life_s`; above
    `flap_suppress` the port is kept out of use until it decays below
    `flap_reuse` (the route-dampening scheme, applied to a port)."""

    penalty: float = 0.0
    at: float = 0.0
    suppressed: bool = False
    flaps: int = 0

    def decayed(self, now: float, policy: HealthPolicy) -> "FlapDamper":
        if now <= self.at or self.penalty == 0:
            return replace(self, at=max(now, self.at))
        penalty = self.penalty * 0.5 ** ((now - self.at) / policy.flap_half_life_s)
        suppressed = self.suppressed and penalty > policy.flap_reuse
        return replace(self, penalty=penalty, at=now, suppressed=suppressed)

    def flap(self, now: float, policy: HealthPolicy) -> "FlapDamper":
        d = self.decayed(now, policy)
        penalty = min(d.penalty + policy.flap_penalty, policy.flap_max_penalty)
        return replace(d, penalty=penalty, suppressed=d.suppressed or penalty >= policy.flap_suppress,
                       flaps=d.flaps + 1)

    def assess(self, policy: HealthPolicy) -> Assessment:
        text = f"penalty {self.penalty:.0f} after {self.flaps} carrier losses"
        if self.suppressed:
            return Assessment("flaps", Verdict.DEGRADED, "suppressed",
                              f"flapping: {text}; suppressed until below {policy.flap_reuse:g}")
        return Assessment("flaps", Verdict.UP, "ok", text)


# --------------------------------------------------------------------------
# Path probes (BFD, echo): judged by their own state machines, kept here
# --------------------------------------------------------------------------


def bfd_assessment(name: str, state: str, *, ever_up: bool, diag: str, peer_state: str,
                   detection_s: float | None, max_lag_s: float) -> Assessment:
    """A BFD session's state as a health signal. Never-established sessions,
    a peer that went AdminDown (RFC 5882: not a path failure) and a Down that
    our own stalled event loop could explain have no opinion: a false
    failover costs as much as a missed one."""
    if state == "UP":
        return Assessment(name, Verdict.UP, "up", "session up")
    if not ever_up:
        return Assessment(name, None, "never up", f"session {state.lower()}, never established")
    if peer_state == "ADMIN_DOWN" or state == "ADMIN_DOWN":
        return Assessment(name, None, "admin down", "administratively down: not a path failure")
    if detection_s and max_lag_s >= detection_s / 2:
        return Assessment(name, None, "suspect", f"down ({diag}) while our event loop was "
                          f"{max_lag_s * 1e3:.0f} ms late against a {detection_s * 1e3:.0f} ms "
                          "detection time: not counted")
    detail = f"down: {diag}" + (f" after {detection_s * 1e3:.0f} ms without packets"
                                if detection_s else "")
    return Assessment(name, Verdict.DOWN, "down", detail)


@dataclass(frozen=True)
class Signals:
    """Everything beyond carrier that health remembers about one port."""

    counters: CounterHistory = field(default_factory=CounterHistory)
    optics: OpticsHistory = field(default_factory=OpticsHistory)
    flaps: FlapDamper = field(default_factory=FlapDamper)
    probes: tuple[tuple[str, Assessment], ...] = ()  # by probe name, sorted

    def with_probe(self, name: str, assessment: Assessment) -> "Signals":
        probes = dict(self.probes)
        probes[name] = assessment
        return replace(self, probes=tuple(sorted(probes.items())))

    def assessments(self, policy: HealthPolicy) -> tuple[Assessment, ...]:
        return (self.counters.last, self.optics.last, self.flaps.assess(policy),
                *(a for _, a in self.probes))

    def severity(self, policy: HealthPolicy) -> Verdict | None:
        return worst(*(a.effective for a in self.assessments(policy)))
