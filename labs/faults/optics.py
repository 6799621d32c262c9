"""A degrading optic: the fault that writes a port's simulated module
readings (labs/simsensor.py, format in labs/simsensor.md) as its RX power
falls, with the error counters that go with it.
"""

from __future__ import annotations

import copy
import time

from labs.faults.base import BackgroundFault
from labs.simsensor import HEALTHY, LANES, THRESHOLDS, SimSensor
from labs.topos.lab import Lab
from labs.topos.plan import HostPlan, LabError


def _fec_per_step(rx_dbm: float) -> tuple[int, int, int]:
    """Corrected, uncorrectable, CRC errors added per step at this RX power:
    none with margin, corrected errors growing tenfold every 2 dB below the
    warning, uncorrectable and CRC once past the alarm."""
    warn, alarm = THRESHOLDS["rx_power_dbm"]["low_warning"], THRESHOLDS["rx_power_dbm"]["low_alarm"]
    corrected = int(10 ** ((warn + 2.0 - rx_dbm) / 2.0)) if rx_dbm < warn + 2.0 else 0
    uncorrectable = int(10 ** ((alarm - rx_dbm) / 2.0) * 5) if rx_dbm < alarm else 0
    return corrected, uncorrectable, uncorrectable


class OpticDegradation(BackgroundFault):
    """RX power ramps linearly from ``start_dbm`` (healthy) to ``end_dbm``
    (past the low alarm) over ``duration_s``, one file write per ``step_s``,
    on the given ``lanes`` (default all); error counters grow as the margin
    goes. Nothing happens to packets: this is the sensor's view only (add a
    RandomLoss for the data plane's). clear() writes healthy values back."""

    kind = "optic-degradation"

    def __init__(self, lab: Lab, host: str | int | HostPlan, rail: int | str, *,
                 start_dbm: float = HEALTHY["rx_power_dbm"][0], end_dbm: float = -13.0,
                 duration_s: float = 5.0, step_s: float = 0.1, lanes: list[int] | None = None):
        super().__init__(lab, host, rail)
        if not duration_s > 0 or not step_s > 0:
            raise LabError("duration_s and step_s must be > 0")
        if end_dbm >= THRESHOLDS["rx_power_dbm"]["low_alarm"]:
            raise LabError(f"end_dbm {end_dbm} does not pass the low alarm "
                           f"({THRESHOLDS['rx_power_dbm']['low_alarm']} dBm)")
        self.lanes = list(range(LANES)) if lanes is None else list(lanes)
        if not self.lanes or any(not 0 <= lane < LANES for lane in self.lanes):
            raise LabError(f"lanes must be a non-empty subset of 0..{LANES - 1}")
        self.start_dbm, self.end_dbm = start_dbm, end_dbm
        self.duration_s, self.step_s = duration_s, step_s
        self.sensor = SimSensor(lab.sim_path(self.host, self.rail.port), self.rail.port)
        self.crossed_alarm_at: float | None = None

    @property
    def budget_s(self) -> float:
        return self.duration_s

    @property
    def description(self) -> str:
        return (f"{super().description}: RX {self.start_dbm:g} -> {self.end_dbm:g} dBm "
                f"over {self.duration_s:g}s, lanes {self.lanes}")

    def _set_rx(self, dbm: float) -> float:
        for lane in self.lanes:
            self.sensor.reading["rx_power_dbm"][lane] = round(dbm, 2)
        corrected, uncorrectable, crc = _fec_per_step(dbm)
        self.sensor.counters["fec_corrected"] += corrected
        self.sensor.counters["fec_uncorrectable"] += uncorrectable
        self.sensor.counters["rx_crc_errors"] += crc
        stamp = self.sensor.write()
        if self.crossed_alarm_at is None and dbm < THRESHOLDS["rx_power_dbm"]["low_alarm"]:
            self.crossed_alarm_at = stamp
        return stamp

    def _inject(self) -> float:
        self.crossed_alarm_at = None
        start = time.monotonic()
        self._set_rx(self.start_dbm)
        self._start(lambda: self._ramp(start), name=f"optic-{self.rail.port}")
        return start

    def _ramp(self, start: float) -> None:
        while not self._stop.wait(self.step_s):
            frac = min(1.0, (time.monotonic() - start) / self.duration_s)
            self._set_rx(self.start_dbm + (self.end_dbm - self.start_dbm) * frac)
            if frac >= 1.0:
                return

    def _clear(self) -> float:
        self._stop_thread()
        stamp = time.monotonic()
        self.sensor.reading = copy.deepcopy(HEALTHY)
        self.sensor.write()
        return stamp
