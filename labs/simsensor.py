"""Simulated optics: one JSON file per host port, the lab's stand-in for a
module's readings, that linkpassd reads with its ``sim`` sensor backend.

The format is described in simsensor.md (schema ``linkpass.simsensor/1``). A
file holds either decoded values (``SimSensor.write``) or a module's raw
EEPROM pages (``SimSensor.write_eeprom``, built by ``CmisModule``), which
linkpassd runs through its production decoders. Every lab host starts with
healthy files (topos.lab); faults (faults.optics) write degrading ones.
"""

from __future__ import annotations

import copy
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from labs.topos.plan import LabError
from linkpassd.adapters.optics import PageRef

SCHEMA = "linkpass.simsensor/1"
LANES = 4

# A 4-lane 100G/400G short-reach module's usual limits (SFF-8636/CMIS style).
THRESHOLDS: dict[str, dict[str, float]] = {
    "temperature_c": {"high_alarm": 75.0, "high_warning": 70.0, "low_warning": 0.0, "low_alarm": -5.0},
    "voltage_v": {"high_alarm": 3.63, "high_warning": 3.465, "low_warning": 3.135, "low_alarm": 2.97},
    "tx_bias_ma": {"high_alarm": 13.0, "high_warning": 12.0, "low_warning": 4.0, "low_alarm": 3.0},
    "tx_power_dbm": {"high_alarm": 4.0, "high_warning": 3.0, "low_warning": -6.0, "low_alarm": -8.0},
    "rx_power_dbm": {"high_alarm": 4.0, "high_warning": 3.0, "low_warning": -9.0, "low_alarm": -11.0},
}

HEALTHY: dict[str, Any] = {
    "temperature_c": 42.0,
    "voltage_v": 3.30,
    "tx_bias_ma": [7.5] * LANES,
    "tx_power_dbm": [-0.5] * LANES,
    "rx_power_dbm": [-1.5] * LANES,
}


class SimSensor:
    """Writes one port's readings atomically (temp file + rename), so a
    reader sees the previous reading or the next, never half of one.
    Counters only grow, like the hardware's: readers take rates."""

    def __init__(self, path: str | os.PathLike[str], port: str):
        self.path = Path(path)
        self.port = port
        self.reading: dict[str, Any] = copy.deepcopy(HEALTHY)
        self.counters = {"fec_corrected": 0, "fec_uncorrectable": 0, "rx_crc_errors": 0,
                         "link_down_count": 0}
        self.sequence = 0
        self.eeprom: Mapping[PageRef, bytes] | None = None  # raw pages instead of values
        try:  # continue the port's history: counters and sequence never go back
            old = json.loads(self.path.read_text())
            self.counters.update({k: int(old["counters"][k]) for k in self.counters})
            self.sequence = int(old["sequence"])
        except (OSError, ValueError, KeyError, TypeError):
            pass

    def document(self) -> dict[str, Any]:
        head = {"schema": SCHEMA, "port": self.port, "written_at": time.monotonic(),
                "sequence": self.sequence}
        if self.eeprom is not None:
            return {**head, "eeprom": eeprom_entries(self.eeprom), "counters": dict(self.counters)}
        return {
            **head,
            "module": {"identifier": "QSFP-DD", "spec": "CMIS 5.0", "lanes": LANES,
                       "vendor": "LINKPASS-SIM"},
            **copy.deepcopy(self.reading),
            "thresholds": copy.deepcopy(THRESHOLDS),
            "counters": dict(self.counters),
        }

    def write(self) -> float:
        """Write the current state; returns its ``written_at``."""
        self.sequence += 1
        doc = self.document()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, self.path)
        return doc["written_at"]

    def write_healthy(self) -> float:
        self.reading = copy.deepcopy(HEALTHY)
        self.eeprom = None
        return self.write()

    def write_eeprom(self, pages: Mapping[PageRef, bytes]) -> float:
        """Write a module's raw pages (e.g. ``CmisModule(...).pages()``) in
        place of decoded values; counters carry on."""
        self.eeprom = dict(pages)
        return self.write()


def eeprom_entries(pages: Mapping[PageRef, bytes]) -> list[dict[str, Any]]:
    """Pages as the file's ``eeprom`` array (simsensor.md)."""
    return [{"i2c": ref.i2c, "bank": ref.bank, "page": ref.page, "offset": ref.offset,
             "hex": bytes(data).hex()} for ref, data in sorted(pages.items())]


def _power_raw(dbm: float) -> int:
    """dBm -> the module's 0.1 uW units."""
    return max(0, min(0xFFFF, round(10 ** (dbm / 10) * 1e4)))


@dataclass(frozen=True)
class CmisModule:
    """A 4-lane CMIS 5.0 QSFP-DD module's memory, built byte by byte at the
    spec's offsets (lower page, pages 00h, 01h, 02h, 11h bank 0), so a lab can
    hand linkpassd's real decoders the faults only bytes can show: lane flags
    with fine readings, ModuleFault, a blank threshold page, flat memory."""

    rx_dbm: tuple[float, ...] = tuple(HEALTHY["rx_power_dbm"])
    tx_dbm: tuple[float, ...] = tuple(HEALTHY["tx_power_dbm"])
    bias_ma: tuple[float, ...] = tuple(HEALTHY["tx_bias_ma"])
    temperature_c: float = HEALTHY["temperature_c"]
    voltage_v: float = HEALTHY["voltage_v"]
    rx_los_lanes: tuple[int, ...] = ()
    rx_power_low_alarm_lanes: tuple[int, ...] = ()
    module_fault: bool = False  # module state ModuleFault (lower byte 3)
    firmware_fault: bool = False  # ModuleFirmwareError flag (lower byte 8 bit 1)
    threshold_fill: int | None = None  # 0x00 / 0xFF: a blank page 02h instead of THRESHOLDS
    flat: bool = False  # flat memory, passive copper: lower page and page 00h only
    serial: str = "SIM0000001"

    def pages(self) -> dict[PageRef, bytes]:
        lower = bytearray(128)
        lower[0], lower[1] = 0x18, 0x50  # QSFP-DD, CMIS 5.0
        lower[2] = 0x80 if self.flat else 0x00
        lower[3] = (5 if self.module_fault else 3) << 1  # ModuleFault / ModuleReady
        lower[8] = 0x02 if self.firmware_fault else 0x00
        lower[14:16] = round(self.temperature_c * 256).to_bytes(2, "big", signed=True)
        lower[16:18] = round(self.voltage_v / 100e-6).to_bytes(2, "big")
        lower[85] = 0x03 if self.flat else 0x01  # module type: passive copper / MMF
        lower[88] = (LANES << 4) | LANES  # application 1: 4 host, 4 media lanes

        p00 = bytearray(128)
        p00[0] = 0x18
        for at, text, width in ((129, "LINKPASS-SIM", 16), (148, "SIM-QDD-SR4", 16),
                                (164, "1A", 2), (166, self.serial, 16)):
            p00[at - 128:at - 128 + width] = text.ljust(width).encode("ascii")
        p00[222 - 128] = sum(p00[:222 - 128]) & 0xFF  # byte 222: checksum of bytes 128-221
        pages = {PageRef.lower(): bytes(lower), PageRef.upper(0x00): bytes(p00)}
        if self.flat:
            return pages

        p01 = bytearray(128)
        p01[151 - 128] = 0x10  # RX power is average power
        p01[157 - 128] = 0x03  # TX fault, TX LOS flags implemented
        p01[158 - 128] = 0x06  # RX LOS, RX CDR LOL flags implemented
        p01[159 - 128] = 0x03  # temperature and Vcc monitors
        p01[160 - 128] = 0x07  # bias, TX power, RX power monitors; bias x1
        p01[176 - 128] = 0x01  # application 1 media lanes start at lane 1

        if self.threshold_fill is not None:
            p02 = bytearray([self.threshold_fill]) * 128
        else:
            p02 = bytearray(128)
            t = THRESHOLDS
            for at, levels, conv, signed in (
                    (128, t["temperature_c"], lambda c: round(c * 256), True),
                    (136, t["voltage_v"], lambda v: round(v / 100e-6), False),
                    (176, t["tx_power_dbm"], _power_raw, False),
                    (184, t["tx_bias_ma"], lambda ma: round(ma / 2e-3), False),
                    (192, t["rx_power_dbm"], _power_raw, False)):
                for i, key in enumerate(("high_alarm", "low_alarm", "high_warning", "low_warning")):
                    p02[at - 128 + 2 * i:at - 128 + 2 * i + 2] = conv(levels[key]).to_bytes(
                        2, "big", signed=signed)

        p11 = bytearray(128)
        p11[0:4] = bytes([0x44, 0x44, 0, 0])  # data path activated, lanes 1-4
        p11[147 - 128] = sum(1 << lane for lane in self.rx_los_lanes)
        p11[150 - 128] = sum(1 << lane for lane in self.rx_power_low_alarm_lanes)
        for at, values, conv in ((154, self.tx_dbm, _power_raw),
                                 (170, self.bias_ma, lambda ma: round(ma / 2e-3)),
                                 (186, self.rx_dbm, _power_raw)):
            if len(values) > LANES or not all(math.isfinite(v) for v in values):
                raise LabError(f"CmisModule: lane values must be {LANES} finite numbers: {values}")
            for lane, value in enumerate(values):
                p11[at - 128 + 2 * lane:at - 128 + 2 * lane + 2] = conv(value).to_bytes(2, "big")
        pages.update({PageRef.upper(0x01): bytes(p01), PageRef.upper(0x02): bytes(p02),
                      PageRef.upper(0x11): bytes(p11)})
        return pages
