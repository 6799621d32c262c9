"""Module EEPROM decoders against byte-exact dumps built from the spec tables.

Each dump places every field at the byte number the spec gives it (SFF-8472
rev 12.x A0h/A2h, SFF-8636 rev 2.10 lower page and pages 00h/03h, CMIS 5.0
lower page and pages 00h/01h/02h/11h).  The expected value next to each
field is worked out by hand from its raw bytes, never by the decoder's
code, so a wrong offset or scaling in the decoder cannot agree with it.
Only the check codes are summed by the builder (that is what they are).
"""

from __future__ import annotations

import math
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from linkpassd.adapters import optics
from linkpassd.adapters.optics import CMIS, SFF8472, SFF8636, PageRef
from linkpassd.core import signals
from linkpassd.core.model import OpticsReading, Thresholds, Unreadable

LOWER = PageRef.lower()
A2 = PageRef.lower(0x51)
P00, P01, P02, P03 = (PageRef.upper(n) for n in (0x00, 0x01, 0x02, 0x03))
P11 = PageRef.upper(0x11, bank=0)


class Page:
    """128 bytes of one page, written at the spec's byte numbers (an upper
    page starts at 128); check codes are summed when the page is built."""

    def __init__(self, base: int = 0):
        self.base = base
        self.data = bytearray(128)
        self.sums: list[tuple[int, int, int]] = []

    def put(self, at: int, hexstr: str) -> "Page":
        raw = bytes.fromhex(hexstr)
        i = at - self.base
        assert 0 <= i and i + len(raw) <= 128, (at, hexstr)
        self.data[i:i + len(raw)] = raw
        return self

    def text(self, at: int, s: str, width: int) -> "Page":
        return self.put(at, s.ljust(width).encode("ascii").hex())

    def checksum(self, first: int, last: int, at: int) -> "Page":
        self.sums.append((first, last, at))
        return self

    def build(self) -> bytes:
        out = bytearray(self.data)
        for first, last, at in self.sums:
            b = self.base
            out[at - b] = sum(out[first - b:last - b + 1]) & 0xFF
        return bytes(out)


def built(pages: dict[PageRef, Page]) -> dict[PageRef, bytes]:
    return {ref: page.build() for ref, page in pages.items()}


def poke(pages: dict[PageRef, bytes], ref: PageRef, at: int, hexstr: str) -> dict[PageRef, bytes]:
    """Overwrite bytes after the check codes were summed (a corrupted read)."""
    out = dict(pages)
    data = bytearray(out[ref])
    raw = bytes.fromhex(hexstr)
    i = at - ref.offset
    data[i:i + len(raw)] = raw
    out[ref] = bytes(data)
    return out


def unreadable(result) -> str:
    assert isinstance(result, Unreadable), result
    assert not result.reason.startswith("internal decode error"), result.reason
    return result.reason


def reading(result) -> OpticsReading:
    assert isinstance(result, OpticsReading), result
    return result


DB = dict(abs=1e-4)  # dBm worked to 4 decimals by hand


# --------------------------------------------------------------------------
# SFP, SFF-8472: A0h (serial ID) + A2h (diagnostics), internally calibrated
# --------------------------------------------------------------------------


def sfp() -> dict[PageRef, Page]:
    a0 = Page()
    a0.put(0, "03")                    # identifier: SFP/SFP+ (SFF-8024)
    a0.put(1, "04")                    # extended identifier: defined by 2-wire ID
    a0.put(2, "07")                    # connector: LC
    a0.put(3, "10")                    # 10G Ethernet compliance: 10GBASE-SR
    a0.put(11, "06")                   # encoding: 64B/66B
    a0.put(12, "67")                   # nominal rate 103 x 100 MBd
    a0.text(20, "ACME OPTICS", 16)     # 20-35 vendor name
    a0.put(37, "009065")               # 37-39 vendor OUI
    a0.text(40, "SFP-10G-SR", 16)      # 40-55 vendor part number
    a0.text(56, "A1", 4)               # 56-59 vendor revision
    a0.put(60, "0352")                 # 60-61 wavelength 850 nm
    a0.checksum(0, 62, 63)             # 63 CC_BASE
    a0.put(64, "001A")                 # 64-65 options: TX_DISABLE, TX_FAULT, LOS
    a0.text(68, "SN0001234567", 16)    # 68-83 vendor serial number
    a0.text(84, "240115", 8)           # 84-91 date code
    a0.put(92, "68")                   # diag type: DDM (6) | internal cal (5) | RX avg power (3)
    a0.put(93, "F0")                   # enhanced: A/W flags (7), soft TX_DISABLE (6), TX_FAULT (5), RX_LOS (4)
    a0.put(94, "08")                   # SFF-8472 compliance code 08h
    a0.checksum(64, 94, 95)            # 95 CC_EXT

    a2 = Page()
    a2.put(0, "4B00")    # temp high alarm   0x4B00 = 75.0 C
    a2.put(2, "FB00")    # temp low alarm    0xFB00 = -1280/256 = -5.0 C
    a2.put(4, "4600")    # temp high warning 0x4600 = 70.0 C
    a2.put(6, "0000")    # temp low warning  0.0 C
    a2.put(8, "8DCC")    # Vcc high alarm   36300 x 100 uV = 3.63 V
    a2.put(10, "7404")   # Vcc low alarm    29700 -> 2.97 V
    a2.put(12, "875A")   # Vcc high warning 34650 -> 3.465 V
    a2.put(14, "7A76")   # Vcc low warning  31350 -> 3.135 V
    a2.put(16, "1D4C")   # bias high alarm   7500 x 2 uA = 15 mA
    a2.put(18, "03E8")   # bias low alarm    1000 -> 2 mA
    a2.put(20, "1770")   # bias high warning 6000 -> 12 mA
    a2.put(22, "05DC")   # bias low warning  1500 -> 3 mA
    a2.put(24, "4E20")   # TX power high alarm   20000 x 0.1 uW = 2.0 mW = +3.0103 dBm
    a2.put(26, "03E8")   # TX power low alarm     1000 -> 0.1 mW = -10 dBm
    a2.put(28, "2710")   # TX power high warning 10000 -> 1.0 mW = 0 dBm
    a2.put(30, "07D0")   # TX power low warning   2000 -> 0.2 mW = -6.9897 dBm
    a2.put(32, "4E20")   # RX power high alarm   2.0 mW = +3.0103 dBm
    a2.put(34, "0064")   # RX power low alarm    100 -> 0.01 mW = -20 dBm
    a2.put(36, "2710")   # RX power high warning 1.0 mW = 0 dBm
    a2.put(38, "00C8")   # RX power low warning  200 -> 0.02 mW = -16.9897 dBm
    a2.put(68, "3F800000")  # Rx_PWR(1) = 1.0f, as internally calibrated modules carry
    for at in (76, 80, 84, 88):
        a2.put(at, "0100")  # slopes 1.0 (8.8 fixed point), offsets 0
    a2.checksum(0, 94, 95)  # 95 CC_DMI
    a2.put(96, "1A80")   # temperature 0x1A80 = 6784/256 = 26.5 C
    a2.put(98, "80E8")   # Vcc 33000 x 100 uV = 3.3 V
    a2.put(100, "0D2F")  # TX bias 3375 x 2 uA = 6.75 mA
    a2.put(102, "1F40")  # TX power 8000 x 0.1 uW = 0.8 mW = -0.9691 dBm
    a2.put(104, "0096")  # RX power 150 x 0.1 uW = 0.015 mW = -18.2391 dBm
    a2.put(110, "00")    # status: TX_FAULT, RX_LOS clear; Data_Ready_Bar 0 (ready)
    a2.put(117, "40")    # warning flags byte 2: RX power low warning (bit 6)
    return {LOWER: a0, A2: a2}


def test_sfp_every_field():
    r = reading(optics.decode(built(sfp())))
    ident = r.identity
    assert (ident.spec, ident.form_factor) == (SFF8472, "SFP/SFP+/SFP28")
    assert (ident.vendor, ident.part, ident.serial, ident.revision) == (
        "ACME OPTICS", "SFP-10G-SR", "SN0001234567", "A1")
    assert ident.spec_revision == "12.0"
    assert r.temperature_c == 26.5
    assert r.voltage_v == pytest.approx(3.3)
    assert r.tx_bias_ma == (pytest.approx(6.75),)
    assert r.tx_power_dbm == (pytest.approx(-0.9691, **DB),)
    assert r.rx_power_dbm == (pytest.approx(-18.2391, **DB),)
    assert dict(r.thresholds) == {
        "temperature_c": Thresholds(high_alarm=75.0, high_warn=70.0, low_warn=0.0, low_alarm=-5.0),
        "voltage_v": Thresholds(high_alarm=pytest.approx(3.63), high_warn=pytest.approx(3.465),
                                low_warn=pytest.approx(3.135), low_alarm=pytest.approx(2.97)),
        "tx_bias_ma": Thresholds(high_alarm=pytest.approx(15.0), high_warn=pytest.approx(12.0),
                                 low_warn=pytest.approx(3.0), low_alarm=pytest.approx(2.0)),
        "tx_power_dbm": Thresholds(high_alarm=pytest.approx(3.0103, **DB), high_warn=pytest.approx(0.0, **DB),
                                   low_warn=pytest.approx(-6.9897, **DB), low_alarm=pytest.approx(-10.0, **DB)),
        "rx_power_dbm": Thresholds(high_alarm=pytest.approx(3.0103, **DB), high_warn=pytest.approx(0.0, **DB),
                                   low_warn=pytest.approx(-16.9897, **DB), low_alarm=pytest.approx(-20.0, **DB)),
    }
    assert r.flags == {"rx_power_low_warning[0]"}
    _, detail = optics.decode_detailed(built(sfp()))
    assert (detail.lanes, detail.rx_power_type, detail.calibration) == (1, "average", "internal")


def test_sfp_every_alarm_and_warning_bit_has_its_name():
    m = sfp()
    m[A2].put(112, "FFC0").put(116, "FFC0")  # all defined alarm and warning bits
    names = {"temperature_high", "temperature_low", "voltage_high", "voltage_low"}
    lane = {"tx_bias_high", "tx_bias_low", "tx_power_high", "tx_power_low", "rx_power_high", "rx_power_low"}
    want = {f"{n}_{k}" for n in names for k in ("alarm", "warning")}
    want |= {f"{n}_{k}[0]" for n in lane for k in ("alarm", "warning")}
    assert reading(optics.decode(built(m))).flags == want


def test_sfp_soft_tx_fault_and_rx_los_only_where_advertised():
    m = sfp()
    m[A2].put(110, "06")  # TX_FAULT state (bit 2), RX_LOS state (bit 1)
    assert reading(optics.decode(built(m))).flags == {
        "tx_fault[0]", "rx_los[0]", "rx_power_low_warning[0]"}
    m[LOWER].put(93, "80")  # flags implemented, but no soft TX_FAULT / RX_LOS monitoring
    assert reading(optics.decode(built(m))).flags == {"rx_power_low_warning[0]"}
    m[LOWER].put(93, "00")  # no alarm/warning flags either
    assert reading(optics.decode(built(m))).flags == frozenset()


def test_sfp_oma_rx_power_is_reported_as_such():
    m = sfp()
    m[LOWER].put(92, "60")  # DDM | internal, bit 3 clear: RX power is OMA
    result = optics.decode_detailed(built(m))
    assert result[1].rx_power_type == "oma"
    assert result[0].rx_power_dbm == (pytest.approx(-18.2391, **DB),)


def test_sfp_without_ddm_reads_no_a2_and_reports_identity_only():
    m = sfp()
    m[LOWER].put(92, "00")
    pages = built(m)
    assert optics.pages_needed(SFF8472, pages[LOWER]) == []
    del pages[A2]
    r = reading(optics.decode(pages))
    assert r.identity.vendor == "ACME OPTICS"
    assert (r.temperature_c, r.voltage_v, r.rx_power_dbm, r.thresholds, r.flags) == (
        None, None, (None,), (), frozenset())


def test_sfp_needing_the_address_change_sequence_is_treated_as_without_dom():
    m = sfp()
    m[LOWER].put(92, "6C")  # DDM, but bit 2: address change required
    assert optics.pages_needed(SFF8472, built(m)[LOWER]) == []


def sfp_external() -> dict[PageRef, Page]:
    """The SFP above, externally calibrated: raw A/D counts plus constants."""
    m = sfp()
    m[LOWER].put(92, "58")      # DDM | external cal (4) | RX avg power
    a2 = m[A2]
    a2.put(0, "4A00").put(2, "FA00").put(4, "4500").put(6, "FF00")  # 74, -6, 69, -1 C raw
    a2.put(8, "8E30").put(10, "7468").put(12, "87BE").put(14, "7ADA")  # 36400 29800 34750 31450
    a2.put(16, "0EA6").put(18, "01F4").put(20, "0BB8").put(22, "02EE")  # 3750 500 3000 750
    a2.put(24, "9470").put(26, "0000").put(28, "4650").put(30, "07D0")  # 38000 0 18000 2000
    a2.put(32, "00C8").put(34, "000A").put(36, "0096").put(38, "0014")  # 200 10 150 20
    a2.put(56, "00000000")      # Rx_PWR(4) = 0
    a2.put(60, "00000000")      # Rx_PWR(3) = 0
    a2.put(64, "3F000000")      # Rx_PWR(2) = 0.5
    a2.put(68, "40000000")      # Rx_PWR(1) = 2.0
    a2.put(72, "42C80000")      # Rx_PWR(0) = 100.0
    a2.put(76, "0200").put(78, "0000")  # Tx_I slope 2.0, offset 0
    a2.put(80, "0080").put(82, "03E8")  # Tx_PWR slope 0.5, offset +1000
    a2.put(84, "0100").put(86, "0100")  # T slope 1.0, offset +256 (= +1 C)
    a2.put(88, "0100").put(90, "FF9C")  # V slope 1.0, offset -100 (= -10 mV)
    a2.put(104, "0064")                 # RX A/D 100
    return m


def test_sfp_external_calibration_applies_to_readings_and_thresholds():
    r, detail = optics.decode_detailed(built(sfp_external()))
    assert detail.calibration == "external"
    assert r.temperature_c == 27.5                  # 26.5 C raw + 1 C offset
    assert r.voltage_v == pytest.approx(3.29)       # 33000 - 100 = 32900 x 100 uV
    assert r.tx_bias_ma == (pytest.approx(13.5),)   # 2.0 x 3375 = 6750 x 2 uA
    assert r.tx_power_dbm == (pytest.approx(-3.0103, **DB),)  # 0.5 x 8000 + 1000 = 5000 -> 0.5 mW
    # Rx = 0.5 x 100^2 + 2.0 x 100 + 100 = 5300 x 0.1 uW = 0.53 mW (the spec's polynomial,
    # not ethtool's 100 + 100 x 2.0 + 100 x 0.5)
    assert r.rx_power_dbm == (pytest.approx(-2.7572, **DB),)
    t = dict(r.thresholds)
    assert t["temperature_c"] == Thresholds(75.0, 70.0, 0.0, -5.0)
    assert t["voltage_v"] == Thresholds(pytest.approx(3.63), pytest.approx(3.465),
                                        pytest.approx(3.135), pytest.approx(2.97))
    assert t["tx_bias_ma"] == Thresholds(pytest.approx(15.0), pytest.approx(12.0),
                                         pytest.approx(3.0), pytest.approx(2.0))
    # 0.5 x 38000 + 1000 = 2.0 mW; 0.5 x 18000 + 1000 = 1.0 mW; 0.5 x 2000 + 1000 = 0.2 mW;
    # 0.5 x 0 + 1000 = 0.1 mW
    assert t["tx_power_dbm"] == Thresholds(pytest.approx(3.0103, **DB), pytest.approx(0.0, **DB),
                                           pytest.approx(-6.9897, **DB), pytest.approx(-10.0, **DB))
    # A/D 200 -> 20500 (2.05 mW); 150 -> 11650 (1.165 mW); 20 -> 340 (0.034 mW); 10 -> 170 (0.017 mW)
    assert t["rx_power_dbm"] == Thresholds(pytest.approx(3.1175, **DB), pytest.approx(0.6633, **DB),
                                           pytest.approx(-14.6852, **DB), pytest.approx(-17.6955, **DB))


@pytest.mark.parametrize("coefficient", ["7FC00000", "7F800000", "FF800000"])  # NaN, +inf, -inf
def test_sfp_non_finite_calibration_constant_is_unreadable(coefficient):
    m = sfp_external()
    m[A2].put(64, coefficient)
    assert "non-finite Rx_PWR" in unreadable(optics.decode(built(m)))


def test_sfp_calibration_to_an_impossible_power_is_unreadable():
    m = sfp_external()
    m[A2].put(56, "7F000000")  # Rx_PWR(4) = 1.7e38: finite constants, absurd result
    reason = unreadable(optics.decode(built(m)))
    assert "impossible" in reason or "not finite" in reason


def test_sfp_claiming_both_calibrations_is_contradictory():
    m = sfp()
    m[LOWER].put(92, "78")
    assert "both internal and external calibration" in unreadable(optics.decode(built(m)))


# --------------------------------------------------------------------------
# QSFP28, SFF-8636: lower page, upper page 00h, upper page 03h (thresholds)
# --------------------------------------------------------------------------


def qsfp28() -> dict[PageRef, Page]:
    lo = Page()
    lo.put(0, "11")        # identifier: QSFP28
    lo.put(1, "07")        # revision compliance 07h: SFF-8636 rev 2.5-2.7
    lo.put(2, "00")        # status: paged memory (bit 2 clear), data ready (bit 0 clear)
    lo.put(3, "04")        # LOS: RX lane 3 (bit 2) -> rx_los[2]
    lo.put(5, "02")        # CDR LOL: RX lane 2 (bit 1) -> rx_cdr_lol[1]
    lo.put(10, "50")       # RX power flags lanes 3/4: lane 3 low alarm (6), low warning (4)
    lo.put(22, "2380")     # temperature 0x2380 = 35 + 128/256 = 35.5 C
    lo.put(26, "8235")     # Vcc 33333 x 100 uV = 3.3333 V
    lo.put(34, "1F40")     # RX power lane 1: 8000 -> 0.8 mW = -0.9691 dBm
    lo.put(36, "1388")     # RX power lane 2: 5000 -> 0.5 mW = -3.0103 dBm
    lo.put(38, "0000")     # RX power lane 3: 0 -> no light = -40 dBm floor
    lo.put(40, "2710")     # RX power lane 4: 10000 -> 1.0 mW = 0 dBm
    lo.put(42, "1964")     # TX bias lane 1: 6500 x 2 uA = 13 mA
    lo.put(44, "1770")     # TX bias lane 2: 6000 -> 12 mA
    lo.put(46, "157C")     # TX bias lane 3: 5500 -> 11 mA
    lo.put(48, "1388")     # TX bias lane 4: 5000 -> 10 mA
    lo.put(50, "2710")     # TX power lane 1: 1.0 mW = 0 dBm
    lo.put(52, "1F40")     # TX power lane 2: 0.8 mW = -0.9691 dBm
    lo.put(54, "186A")     # TX power lane 3: 6250 -> 0.625 mW = -2.0412 dBm
    lo.put(56, "3E80")     # TX power lane 4: 16000 -> 1.6 mW = +2.0412 dBm

    p00 = Page(128)
    p00.put(128, "11")                  # identifier (copy of byte 0)
    p00.put(130, "0C")                  # connector: MPO 1x12
    p00.put(131, "80")                  # extended compliance in byte 192
    p00.text(148, "QSFP VENDOR INC", 16)  # 148-163 vendor name
    p00.put(165, "00A0C9")              # 165-167 vendor OUI
    p00.text(168, "QSFP28-100G-SR4", 16)  # 168-183 part number
    p00.text(184, "02", 2)              # 184-185 revision
    p00.put(186, "4268")                # wavelength 17000 x 0.05 nm = 850 nm
    p00.checksum(128, 190, 191)         # 191 CC_BASE
    p00.put(192, "02")                  # 100GBASE-SR4
    p00.put(194, "30")                  # options: TX CDR LOL (5), RX CDR LOL (4) flags
    p00.put(195, "0A")                  # options: TX_FAULT (3), TX LOS (1) implemented
    p00.text(196, "QX12345678", 16)     # 196-211 serial number
    p00.text(212, "231201", 8)          # 212-219 date code
    p00.put(220, "3C")                  # diag: temp (5), Vcc (4), RX avg (3), TX power (2)
    p00.checksum(192, 222, 223)         # 223 CC_EXT

    p03 = Page(128)
    p03.put(128, "5000")   # temp high alarm    80.0 C
    p03.put(130, "F600")   # temp low alarm    -10.0 C
    p03.put(132, "4B00")   # temp high warning  75.0 C
    p03.put(134, "FB00")   # temp low warning   -5.0 C
    p03.put(144, "8DCC")   # Vcc HA 3.63 V
    p03.put(146, "7404")   # Vcc LA 2.97 V
    p03.put(148, "875A")   # Vcc HW 3.465 V
    p03.put(150, "7A76")   # Vcc LW 3.135 V
    p03.put(176, "4E20")   # RX power HA 2.0 mW = +3.0103 dBm
    p03.put(178, "01F4")   # RX power LA 500 -> 0.05 mW = -13.0103 dBm
    p03.put(180, "3A98")   # RX power HW 15000 -> 1.5 mW = +1.7609 dBm
    p03.put(182, "03E8")   # RX power LW 0.1 mW = -10 dBm
    p03.put(184, "1D4C")   # TX bias HA 15 mA
    p03.put(186, "03E8")   # TX bias LA 2 mA
    p03.put(188, "1B58")   # TX bias HW 7000 -> 14 mA
    p03.put(190, "05DC")   # TX bias LW 3 mA
    p03.put(192, "4E20")   # TX power HA 2.0 mW = +3.0103 dBm
    p03.put(194, "07D0")   # TX power LA 0.2 mW = -6.9897 dBm
    p03.put(196, "4650")   # TX power HW 18000 -> 1.8 mW = +2.5527 dBm
    p03.put(198, "0BB8")   # TX power LW 3000 -> 0.3 mW = -5.2288 dBm
    return {LOWER: lo, P00: p00, P03: p03}


def test_qsfp28_every_field():
    r, detail = optics.decode_detailed(built(qsfp28()))
    ident = r.identity
    assert (ident.spec, ident.form_factor, ident.spec_revision) == (SFF8636, "QSFP28", "2.5-2.7")
    assert (ident.vendor, ident.part, ident.serial, ident.revision) == (
        "QSFP VENDOR INC", "QSFP28-100G-SR4", "QX12345678", "02")
    assert r.temperature_c == 35.5
    assert r.voltage_v == pytest.approx(3.3333)
    assert r.rx_power_dbm == (pytest.approx(-0.9691, **DB), pytest.approx(-3.0103, **DB),
                              -40.0, pytest.approx(0.0, **DB))
    assert r.tx_bias_ma == (pytest.approx(13.0), pytest.approx(12.0),
                            pytest.approx(11.0), pytest.approx(10.0))
    assert r.tx_power_dbm == (pytest.approx(0.0, **DB), pytest.approx(-0.9691, **DB),
                              pytest.approx(-2.0412, **DB), pytest.approx(2.0412, **DB))
    assert dict(r.thresholds) == {
        "temperature_c": Thresholds(high_alarm=80.0, high_warn=75.0, low_warn=-5.0, low_alarm=-10.0),
        "voltage_v": Thresholds(pytest.approx(3.63), pytest.approx(3.465),
                                pytest.approx(3.135), pytest.approx(2.97)),
        "rx_power_dbm": Thresholds(pytest.approx(3.0103, **DB), pytest.approx(1.7609, **DB),
                                   pytest.approx(-10.0, **DB), pytest.approx(-13.0103, **DB)),
        "tx_bias_ma": Thresholds(pytest.approx(15.0), pytest.approx(14.0),
                                 pytest.approx(3.0), pytest.approx(2.0)),
        "tx_power_dbm": Thresholds(pytest.approx(3.0103, **DB), pytest.approx(2.5527, **DB),
                                   pytest.approx(-5.2288, **DB), pytest.approx(-6.9897, **DB)),
    }
    assert r.flags == {"rx_los[2]", "rx_cdr_lol[1]", "rx_power_low_alarm[2]",
                       "rx_power_low_warning[2]"}
    assert (detail.lanes, detail.rx_power_type) == (4, "average")


def test_qsfp28_lane_flag_bits_map_to_lanes():
    m = qsfp28()
    # byte 9: lane 1 HA (7) and lane 2 LW (0); byte 12: TX bias lane 4 HW (1);
    # byte 13: TX power lane 1 LA (6); byte 4: TX fault lane 4 (3); byte 3: TX LOS lane 1 (4)
    m[LOWER].put(9, "81").put(12, "02").put(13, "40").put(4, "08").put(3, "14")
    m[LOWER].put(6, "80").put(7, "10")  # temperature high alarm; voltage low warning
    assert reading(optics.decode(built(m))).flags == {
        "rx_power_high_alarm[0]", "rx_power_low_warning[1]", "tx_bias_high_warning[3]",
        "tx_power_low_alarm[0]", "tx_fault[3]", "tx_los[0]", "rx_los[2]", "rx_cdr_lol[1]",
        "rx_power_low_alarm[2]", "rx_power_low_warning[2]",
        "temperature_high_alarm", "voltage_low_warning"}


def test_qsfp28_flags_of_unadvertised_functions_are_not_reported():
    m = qsfp28()
    m[LOWER].put(4, "0F").put(5, "FF")  # TX fault all lanes; every CDR LOL
    m[P00].put(194, "00").put(195, "00")  # ... but none of it advertised
    assert reading(optics.decode(built(m))).flags == {
        "rx_los[2]", "rx_power_low_alarm[2]", "rx_power_low_warning[2]"}


def test_qsfp28_without_tx_power_monitor():
    m = qsfp28()
    m[P00].put(220, "38")  # bit 2 clear: no TX power measurement
    r = reading(optics.decode(built(m)))
    assert r.tx_power_dbm == (None, None, None, None)
    assert "tx_power_dbm" not in dict(r.thresholds)


def test_qsfp_flat_memory_reads_no_page_03_and_reports_no_lane_light():
    m = qsfp28()
    m[LOWER].put(2, "04")  # flat memory (passive copper)
    pages = built(m)
    assert optics.pages_needed(SFF8636, pages[LOWER]) == [P00]
    del pages[P03]
    r = reading(optics.decode(pages))
    assert r.rx_power_dbm == (None,) * 4 and r.tx_bias_ma == (None,) * 4
    assert r.thresholds == ()
    assert r.temperature_c == 35.5  # still advertised by page 00h byte 220


def test_all_zero_thresholds_decode_as_four_equal_levels_not_as_none():
    """A blank block is kept (the core says "thresholds unreadable"), not
    dropped: dropped, it would look like a module that gives no thresholds."""
    m = qsfp28()
    m[P03].put(176, "00" * 8)  # RX power HA, LA, HW, LW all 0 mW -> the -40 dBm floor
    r = reading(optics.decode(built(m)))
    assert r.threshold("rx_power_dbm") == Thresholds(-40.0, -40.0, -40.0, -40.0)
    assert signals.thresholds_unreadable(r.threshold("rx_power_dbm"))
    assert not signals.thresholds_unreadable(r.threshold("temperature_c"))


# A blank threshold page, worked by hand: raw 0xFFFF is, signed, -1/256 C; as
# Vcc 65535 x 100 uV = 6.5535 V; as bias 65535 x 2 uA = 131.07 mA (x2 on the
# QSFP-DD below); as power 6.5535 mW = 10 log10(6.5535) = 8.1647 dBm.
FF_LEVELS = {"temperature_c": -1 / 256, "voltage_v": 6.5535, "tx_bias_ma": 131.07,
             "tx_power_dbm": 8.1647, "rx_power_dbm": 8.1647}


@pytest.mark.parametrize("module, ref, first, bias_x", [
    ("qsfp28", P03, 128, 1), ("qsfp_dd", P02, 128, 2)])
@pytest.mark.parametrize("fill", ["FF", "00"])
def test_a_blank_threshold_page_gives_four_equal_levels_for_every_quantity(module, ref, first,
                                                                          bias_x, fill):
    m = MODULES[module]()
    m[ref].put(first, fill * 128)
    r = reading(optics.decode(built(m)))
    assert {q for q, _ in r.thresholds} == set(FF_LEVELS)
    for quantity, level in FF_LEVELS.items():
        t = r.threshold(quantity)
        if fill == "00":
            level = -40.0 if quantity.endswith("_dbm") else 0.0
        elif quantity == "tx_bias_ma":
            level *= bias_x
        assert t == Thresholds(*(pytest.approx(level, **DB),) * 4), quantity
        assert signals.thresholds_unreadable(t)


def test_sfp_blank_threshold_block_gives_four_equal_levels():
    m = sfp()
    m[A2].put(0, "FF" * 40)  # A2h 0-39: every threshold of the five quantities
    r = reading(optics.decode(built(m)))
    assert r.threshold("rx_power_dbm") == Thresholds(*(pytest.approx(8.1647, **DB),) * 4)
    assert r.threshold("temperature_c") == Thresholds(*(-1 / 256,) * 4)
    assert all(signals.thresholds_unreadable(t) for _, t in r.thresholds)


# --------------------------------------------------------------------------
# QSFP-DD, CMIS 5.0: lower page, pages 00h, 01h, 02h, 11h bank 0
# --------------------------------------------------------------------------


def qsfp_dd() -> dict[PageRef, Page]:
    lo = Page()
    lo.put(0, "18")        # identifier: QSFP-DD
    lo.put(1, "50")        # CMIS revision 5.0
    lo.put(2, "00")        # memory model paged (bit 7 clear)
    lo.put(3, "06")        # module state 3 (ModuleReady) in bits 3-1
    lo.put(9, "04")        # module flags: temperature high warning (bit 2)
    lo.put(14, "4780")     # temperature 0x4780 = 71 + 128/256 = 71.5 C
    lo.put(16, "80E8")     # Vcc 33000 x 100 uV = 3.3 V
    lo.put(85, "01")       # module type: MMF
    lo.put(86, "11")       # application 1 host interface
    lo.put(87, "0A")       # application 1 media interface
    lo.put(88, "88")       # application 1: 8 host lanes (7-4), 8 media lanes (3-0)
    lo.put(89, "01")       # host lane assignment: lane 1

    p00 = Page(128)
    p00.put(128, "18")                     # identifier copy
    p00.text(129, "CMIS OPTO CORP", 16)    # 129-144 vendor name
    p00.put(145, "0090FA")                 # 145-147 OUI
    p00.text(148, "QDD-400G-SR8", 16)      # 148-163 part number
    p00.text(164, "1A", 2)                 # 164-165 revision
    p00.text(166, "CM0000000042", 16)      # 166-181 serial number
    p00.text(182, "250301", 8)             # 182-189 date code
    p00.put(200, "E0")                     # power class 8
    p00.put(201, "30")                     # max power 48 x 0.25 W
    p00.put(203, "0C")                     # connector MPO 1x12
    p00.put(212, "00")                     # media technology: 850 nm VCSEL
    p00.checksum(128, 221, 222)            # 222 page checksum

    p01 = Page(128)
    p01.put(142, "00")   # banks supported: bank 0 only
    p01.put(151, "10")   # bit 4: RX power is average power
    p01.put(157, "07")   # TX flags: fault (0), LOS (1), CDR LOL (2)
    p01.put(158, "06")   # RX flags: LOS (1), CDR LOL (2)
    p01.put(159, "03")   # module monitors: temperature (0), Vcc (1)
    p01.put(160, "0F")   # lane monitors: bias (0), TX power (1), RX power (2); bias x2 (bits 4-3 = 01)
    p01.put(176, "01")   # application 1 media lanes may start at lane 1 only

    p02 = Page(128)
    p02.put(128, "4B00")  # temp HA 75.0 C
    p02.put(130, "FB00")  # temp LA -5.0 C
    p02.put(132, "4600")  # temp HW 70.0 C
    p02.put(134, "0000")  # temp LW 0.0 C
    p02.put(136, "8CA0")  # Vcc HA 36000 -> 3.6 V
    p02.put(138, "7530")  # Vcc LA 30000 -> 3.0 V
    p02.put(140, "88B8")  # Vcc HW 35000 -> 3.5 V
    p02.put(142, "7918")  # Vcc LW 31000 -> 3.1 V
    p02.put(176, "4E20")  # TX power HA 2.0 mW = +3.0103 dBm
    p02.put(178, "03E8")  # TX power LA 0.1 mW = -10 dBm
    p02.put(180, "3A98")  # TX power HW 1.5 mW = +1.7609 dBm
    p02.put(182, "07D0")  # TX power LW 0.2 mW = -6.9897 dBm
    p02.put(184, "1388")  # TX bias HA 5000 x 2 uA x 2 = 20 mA
    p02.put(186, "01F4")  # TX bias LA  500 -> 2 mA
    p02.put(188, "1194")  # TX bias HW 4500 -> 18 mA
    p02.put(190, "02EE")  # TX bias LW  750 -> 3 mA
    p02.put(192, "4E20")  # RX power HA 2.0 mW = +3.0103 dBm
    p02.put(194, "00C8")  # RX power LA 0.02 mW = -16.9897 dBm
    p02.put(196, "2EE0")  # RX power HW 12000 -> 1.2 mW = +0.7918 dBm
    p02.put(198, "01F4")  # RX power LW 0.05 mW = -13.0103 dBm

    p11 = Page(128)
    p11.put(128, "44444444")   # data path state: activated, all lanes
    p11.put(145, "80")         # TX bias high warning: lane 8 (bit 7)
    p11.put(147, "20")         # RX LOS: lane 6 (bit 5)
    p11.put(148, "40")         # RX CDR LOL: lane 7 (bit 6)
    p11.put(150, "20")         # RX power low alarm: lane 6
    p11.put(152, "20")         # RX power low warning: lane 6
    # 154-169 TX power lanes 1-8 (0.1 uW): 0.8 0.9 1.0 0.6 0.5 1.1 1.2 0.4 mW
    p11.put(154, "1F40" "2328" "2710" "1770" "1388" "2AF8" "2EE0" "0FA0")
    # 170-185 TX bias lanes 1-8 (2 uA, x2): 2000..2750 step 125 -> 8.0..11.0 mA; 4600 -> 18.4 mA
    p11.put(170, "07D0" "084D" "08CA" "0947" "09C4" "0A41" "0ABE" "11F8")
    # 186-201 RX power lanes 1-8: 0.5 0.6 0.7 0.8 0.9 0(dark) 1.0 0.3 mW
    p11.put(186, "1388" "1770" "1B58" "1F40" "2328" "0000" "2710" "0BB8")
    return {LOWER: lo, P00: p00, P01: p01, P02: p02, P11: p11}


def test_cmis_every_field():
    r, detail = optics.decode_detailed(built(qsfp_dd()))
    ident = r.identity
    assert (ident.spec, ident.form_factor, ident.spec_revision) == (CMIS, "QSFP-DD", "5.0")
    assert (ident.vendor, ident.part, ident.serial, ident.revision) == (
        "CMIS OPTO CORP", "QDD-400G-SR8", "CM0000000042", "1A")
    assert r.temperature_c == 71.5
    assert r.voltage_v == pytest.approx(3.3)
    assert r.tx_power_dbm == pytest.approx(
        (-0.9691, -0.4576, 0.0, -2.2185, -3.0103, 0.4139, 0.7918, -3.9794), **DB)
    assert r.tx_bias_ma == pytest.approx((8.0, 8.5, 9.0, 9.5, 10.0, 10.5, 11.0, 18.4))
    assert r.rx_power_dbm == pytest.approx(
        (-3.0103, -2.2185, -1.5490, -0.9691, -0.4576, -40.0, 0.0, -5.2288), **DB)
    assert dict(r.thresholds) == {
        "temperature_c": Thresholds(high_alarm=75.0, high_warn=70.0, low_warn=0.0, low_alarm=-5.0),
        "voltage_v": Thresholds(pytest.approx(3.6), pytest.approx(3.5),
                                pytest.approx(3.1), pytest.approx(3.0)),
        "tx_power_dbm": Thresholds(pytest.approx(3.0103, **DB), pytest.approx(1.7609, **DB),
                                   pytest.approx(-6.9897, **DB), pytest.approx(-10.0, **DB)),
        "tx_bias_ma": Thresholds(pytest.approx(20.0), pytest.approx(18.0),
                                 pytest.approx(3.0), pytest.approx(2.0)),
        "rx_power_dbm": Thresholds(pytest.approx(3.0103, **DB), pytest.approx(0.7918, **DB),
                                   pytest.approx(-13.0103, **DB), pytest.approx(-16.9897, **DB)),
    }
    assert r.flags == {"temperature_high_warning", "tx_bias_high_warning[7]", "rx_los[5]",
                       "rx_cdr_lol[6]", "rx_power_low_alarm[5]", "rx_power_low_warning[5]"}
    assert (detail.lanes, detail.banks, detail.rx_power_type, detail.tx_bias_multiplier) == (
        8, 1, "average", 2)


@pytest.mark.parametrize("scaling, multiplier, lane0_ma", [("00", 1, 4.0), ("08", 2, 8.0), ("10", 4, 16.0)])
def test_cmis_tx_bias_multiplier_scales_readings_and_thresholds(scaling, multiplier, lane0_ma):
    m = qsfp_dd()
    m[P01].put(160, f"{0x07 | int(scaling, 16):02X}")
    m[P11].put(170, "07D0" * 8)  # 2000 x 2 uA = 4 mA before the multiplier
    r, detail = optics.decode_detailed(built(m))
    assert detail.tx_bias_multiplier == multiplier
    assert r.tx_bias_ma == pytest.approx((lane0_ma,) * 8)
    assert r.threshold("tx_bias_ma").high_alarm == pytest.approx(10.0 * multiplier)  # 5000 x 2 uA


def test_cmis_reserved_bias_scaling_is_unreadable():
    m = qsfp_dd()
    m[P01].put(160, "1F")
    assert "reserved" in unreadable(optics.decode(built(m)))


@pytest.mark.parametrize("count_byte, starts, lanes", [
    ("44", "01", [0, 1, 2, 3]),                       # 400G-DR4 in one 4-lane group
    ("44", "11", [0, 1, 2, 3, 4, 5, 6, 7]),           # twin 400G-DR4 in an OSFP
    ("44", "10", [4, 5, 6, 7]),                       # only the upper group
    ("81", "FF", [0, 1, 2, 3, 4, 5, 6, 7]),           # 8 host lanes on 1 media lane per start
    ("80", "01", [0, 1, 2, 3, 4, 5, 6, 7]),           # media lane count 0: not advertised
])
def test_cmis_lanes_follow_application_1(count_byte, starts, lanes):
    m = qsfp_dd()
    m[LOWER].put(88, count_byte)
    m[P01].put(176, starts)
    r, detail = optics.decode_detailed(built(m))
    n = lanes[-1] + 1
    assert detail.lanes == n and len(r.rx_power_dbm) == n
    assert [i for i, v in enumerate(r.rx_power_dbm) if v is not None] == lanes
    assert [i for i, v in enumerate(r.tx_bias_ma) if v is not None] == lanes
    # flags of lanes outside the application are not reported
    assert ("rx_los[5]" in r.flags) == (5 in lanes)


def test_cmis_every_lane_flag_byte_has_its_name():
    m = qsfp_dd()
    m[P01].put(157, "0F")  # also advertise TX adaptive EQ fault (bit 3)
    m[P11].put(135, "01" "02" "04" "08"   # 135 TX fault lane 1, 136 TX LOS lane 2, 137 TX CDR LOL lane 3,
                                          # 138 TX adaptive EQ fault lane 4
                    "10" "20" "40" "80"   # 139-142 TX power HA lane 5, LA lane 6, HW lane 7, LW lane 8
                    "01" "02" "04" "08"   # 143-146 TX bias HA lane 1, LA lane 2, HW lane 3, LW lane 4
                    "10" "20"             # 147 RX LOS lane 5, 148 RX CDR LOL lane 6
                    "40" "80" "01" "02")  # 149-152 RX power HA lane 7, LA lane 8, HW lane 1, LW lane 2
    assert reading(optics.decode(built(m))).flags == {
        "temperature_high_warning",
        "tx_fault[0]", "tx_los[1]", "tx_cdr_lol[2]", "tx_adaptive_eq_fault[3]",
        "tx_power_high_alarm[4]", "tx_power_low_alarm[5]", "tx_power_high_warning[6]",
        "tx_power_low_warning[7]",
        "tx_bias_high_alarm[0]", "tx_bias_low_alarm[1]", "tx_bias_high_warning[2]",
        "tx_bias_low_warning[3]",
        "rx_los[4]", "rx_cdr_lol[5]",
        "rx_power_high_alarm[6]", "rx_power_low_alarm[7]", "rx_power_high_warning[0]",
        "rx_power_low_warning[1]"}


@pytest.mark.parametrize("bit, name", [
    (0, "temperature_high_alarm"), (1, "temperature_low_alarm"),
    (2, "temperature_high_warning"), (3, "temperature_low_warning"),
    (4, "voltage_high_alarm"), (5, "voltage_low_alarm"),
    (6, "voltage_high_warning"), (7, "voltage_low_warning")])
def test_cmis_module_flag_bits(bit, name):
    m = qsfp_dd()
    m[LOWER].put(9, f"{1 << bit:02X}")
    m[P11].put(145, "00" "00" "00" "00" "00" "00" "00" "00")  # no lane flags
    assert reading(optics.decode(built(m))).flags == {name}


@pytest.mark.parametrize("byte, bit, name", [
    (6, 7, "temperature_high_alarm"), (6, 6, "temperature_low_alarm"),
    (6, 5, "temperature_high_warning"), (6, 4, "temperature_low_warning"),
    (7, 7, "voltage_high_alarm"), (7, 6, "voltage_low_alarm"),
    (7, 5, "voltage_high_warning"), (7, 4, "voltage_low_warning")])
def test_qsfp28_module_flag_bits(byte, bit, name):
    m = qsfp28()
    m[LOWER].put(3, "00").put(5, "00").put(10, "00")  # no lane flags
    m[LOWER].put(byte, f"{1 << bit:02X}")
    assert reading(optics.decode(built(m))).flags == {name}


def test_cmis_unadvertised_monitors_and_flags_are_absent():
    m = qsfp_dd()
    m[P01].put(159, "00").put(160, "00").put(157, "00").put(158, "00")
    r = reading(optics.decode(built(m)))
    assert (r.temperature_c, r.voltage_v) == (None, None)
    assert r.tx_bias_ma == r.tx_power_dbm == r.rx_power_dbm == (None,) * 8
    assert r.thresholds == () and r.flags == frozenset()


def test_cmis_module_fault_state_is_a_flag():
    m = qsfp_dd()
    m[LOWER].put(3, "0A")  # state 5 = ModuleFault
    assert "module_fault" in reading(optics.decode(built(m))).flags


@pytest.mark.parametrize("byte8, want", [
    ("01", set()),                                            # bit 0 ModuleStateChanged: no fault
    ("02", {"module_firmware_fault"}),                        # bit 1 ModuleFirmwareError
    ("04", {"datapath_firmware_fault"}),                      # bit 2 DataPathFirmwareError
    ("07", {"module_firmware_fault", "datapath_firmware_fault"})])
def test_cmis_module_firmware_fault_flags(byte8, want):
    m = qsfp_dd()
    m[LOWER].put(8, byte8)
    flags = reading(optics.decode(built(m))).flags
    assert flags & {"module_fault", "module_firmware_fault", "datapath_firmware_fault"} == want


@pytest.mark.parametrize("state, byte8, want", [
    ("0A", "00", {"module_fault"}),           # state 5 ModuleFault
    ("06", "02", {"module_firmware_fault"}),  # ModuleReady, firmware error flag
    ("06", "00", set())])                     # ModuleReady
def test_cmis_flat_memory_module_still_reports_its_faults(state, byte8, want):
    m = qsfp_dd()
    m[LOWER].put(2, "80").put(3, state).put(8, byte8)
    r = reading(optics.decode({LOWER: m[LOWER].build(), P00: m[P00].build()}))
    assert r.flags == want


def test_cmis_oma_rx_power_type():
    m = qsfp_dd()
    m[P01].put(151, "00")
    assert optics.decode_detailed(built(m))[1].rx_power_type == "oma"


def test_cmis_flat_memory_needs_page_00_only_and_reports_identity():
    m = qsfp_dd()
    m[LOWER].put(2, "80")
    pages = {LOWER: m[LOWER].build(), P00: m[P00].build()}
    assert optics.pages_needed(CMIS, pages[LOWER]) == [P00]
    r = reading(optics.decode(pages))
    assert r.identity.part == "QDD-400G-SR8"
    assert (r.temperature_c, r.rx_power_dbm, r.thresholds) == (None, (), ())
    assert signals.is_passive(r)


def test_modules_without_monitors_are_passive_and_active_ones_are_not():
    """Flat memory (CMIS, SFF-8636) and an SFP without DDM have no lane
    monitors and no thresholds: "no monitors (passive)" in the core."""
    q = qsfp28()
    q[LOWER].put(2, "04")
    flat_qsfp = {LOWER: q[LOWER].build(), P00: q[P00].build()}
    s = sfp()
    s[LOWER].put(92, "00")
    no_ddm_sfp = {LOWER: s[LOWER].build()}
    for pages in (flat_qsfp, no_ddm_sfp):
        assert signals.is_passive(reading(optics.decode(pages)))
    for module in ("sfp", "qsfp28", "qsfp_dd"):
        assert not signals.is_passive(reading(optics.decode(built(MODULES[module]()))))


def test_cmis_multi_bank_modules_are_noted_but_bank_0_is_decoded():
    m = qsfp_dd()
    m[P01].put(142, "02")  # banks 0-3 (32 lanes)
    r, detail = optics.decode_detailed(built(m))
    assert detail.banks == 4 and detail.lanes == 8


def test_cmis_revision_outside_3_to_5_is_unreadable():
    m = qsfp_dd()
    m[LOWER].put(1, "21")
    assert "CMIS revision 2.1" in unreadable(optics.decode(built(m)))


# --------------------------------------------------------------------------
# identify, pages_needed
# --------------------------------------------------------------------------


@pytest.mark.parametrize("ident, spec", [
    ("03", SFF8472), ("0C", SFF8636), ("0D", SFF8636), ("11", SFF8636),
    ("18", CMIS), ("19", CMIS), ("1E", CMIS)])
def test_identify(ident, spec):
    assert optics.identify(bytes.fromhex(ident) + bytes(127)) == spec


@pytest.mark.parametrize("ident", ["00", "FF", "06", "85", "7E"])
def test_identify_refuses_what_is_not_a_supported_module(ident):
    reason = unreadable(optics.identify(bytes.fromhex(ident) + bytes(127)))
    assert f"identifier 0x{ident}" in reason and "not a supported module" in reason


def test_pages_needed_per_spec():
    assert optics.pages_needed(SFF8472, built(sfp())[LOWER]) == [A2]
    assert optics.pages_needed(SFF8636, built(qsfp28())[LOWER]) == [P00, P03]
    assert optics.pages_needed(CMIS, built(qsfp_dd())[LOWER]) == [P00, P01, P02, P11]
    assert P11 == PageRef(i2c=0x50, bank=0, page=0x11, offset=128)
    assert A2 == PageRef(i2c=0x51, bank=0, page=0, offset=0)


def test_pages_needed_refuses_bad_input():
    assert "unknown spec" in unreadable(optics.pages_needed("SFF-8079", bytes(128)))
    assert "truncated" in unreadable(optics.pages_needed(CMIS, bytes(64)))


# --------------------------------------------------------------------------
# Malformed input: each named malformation is Unreadable, with its name
# --------------------------------------------------------------------------

MODULES = {"sfp": sfp, "qsfp28": qsfp28, "qsfp_dd": qsfp_dd}


@pytest.mark.parametrize("module", MODULES)
def test_truncated_pages(module):
    pages = built(MODULES[module]())
    for ref in pages:
        cut = dict(pages)
        cut[ref] = pages[ref][:100]
        assert "truncated page, 100 of 128 bytes" in unreadable(optics.decode(cut))


@pytest.mark.parametrize("module", MODULES)
def test_missing_required_pages(module):
    pages = built(MODULES[module]())
    for ref in pages:
        rest = {k: v for k, v in pages.items() if k != ref}
        assert f"missing required page: {ref}" in unreadable(optics.decode(rest))


def test_oversized_or_non_bytes_pages():
    pages = built(qsfp28())
    assert "256 bytes" in unreadable(optics.decode({**pages, P00: pages[P00] * 2}))
    assert "expected bytes" in unreadable(optics.decode({**pages, P03: "00" * 128}))
    assert "expected a mapping" in unreadable(optics.decode([pages[LOWER]]))


@pytest.mark.parametrize("module, ref, at, field", [
    ("sfp", LOWER, 20, "vendor name"), ("sfp", LOWER, 70, "serial number"),
    ("qsfp28", P00, 170, "part number"), ("qsfp_dd", P00, 164, "revision")])
def test_unprintable_identity_strings(module, ref, at, field):
    m = MODULES[module]()
    m[ref].put(at, "07")  # BEL, with check codes recomputed: only the text is wrong
    assert f"unprintable {field}" in unreadable(optics.decode(built(m)))


@pytest.mark.parametrize("module, ref, at", [
    ("sfp", LOWER, 63), ("sfp", LOWER, 95),
    ("qsfp28", P00, 191), ("qsfp28", P00, 223), ("qsfp_dd", P00, 222)])
def test_checksum_mismatch(module, ref, at):
    pages = built(MODULES[module]())
    stored = pages[ref][at - ref.offset]
    bad = poke(pages, ref, at, f"{stored ^ 0x01:02X}")
    assert f"checksum mismatch at byte {at}" in unreadable(optics.decode(bad))


def test_corrupted_covered_byte_is_a_checksum_mismatch_too():
    pages = poke(built(sfp()), LOWER, 40, "54")  # part number byte flipped after summing
    assert "CC_BASE (A0h) checksum mismatch at byte 63" in unreadable(optics.decode(pages))


@pytest.mark.parametrize("module, ref, at", [("sfp", A2, 96), ("qsfp28", LOWER, 22), ("qsfp_dd", LOWER, 14)])
def test_impossible_temperature(module, ref, at):
    m = MODULES[module]()
    m[ref].put(at, "8000")  # -128.0 C, the most negative code
    assert "temperature -128 C is impossible" in unreadable(optics.decode(built(m)))


@pytest.mark.parametrize("module, ref, at", [("sfp", A2, 98), ("qsfp28", LOWER, 26), ("qsfp_dd", LOWER, 16)])
def test_impossible_voltage(module, ref, at):
    m = MODULES[module]()
    m[ref].put(at, "0000")
    assert "supply voltage 0 V is impossible" in unreadable(optics.decode(built(m)))


@pytest.mark.parametrize("module, ref, at, hexstr, want", [
    # temperature high alarm -10 C below low alarm -5 C: inverted
    ("sfp", A2, 0, "F600", "temperature_c thresholds out of order (inverted): high_alarm -10 < low_alarm -5"),
    # RX power low warning above high warning
    ("qsfp28", P03, 182, "4E20", "rx_power_dbm thresholds out of order (inverted): high_warn 1.5 < low_warn 2"),
    # TX bias high warning above high alarm (20 mA x2 scaling: raw 6000 -> 24 mA)
    ("qsfp_dd", P02, 188, "1770", "tx_bias_ma thresholds out of order (inverted): high_alarm 20 < high_warn 24"),
])
def test_contradictory_thresholds(module, ref, at, hexstr, want):
    m = MODULES[module]()
    m[ref].put(at, hexstr)
    assert want in unreadable(optics.decode(built(m)))


@pytest.mark.parametrize("module, ref", [("qsfp28", P00), ("qsfp_dd", P00)])
def test_identifier_copy_mismatch(module, ref):
    m = MODULES[module]()
    m[ref].put(128, "0D")
    assert "identifier mismatch" in unreadable(optics.decode(built(m)))


def test_identifier_not_a_module():
    m = sfp()
    m[LOWER].put(0, "00")
    assert "identifier 0x00" in unreadable(optics.decode(built(m)))


@pytest.mark.parametrize("module, ref, at, hexstr, want", [
    ("sfp", A2, 110, "01", "Data_Ready_Bar"), ("qsfp28", LOWER, 2, "01", "Data_Not_Ready")])
def test_data_not_ready(module, ref, at, hexstr, want):
    m = MODULES[module]()
    m[ref].put(at, hexstr)
    assert want in unreadable(optics.decode(built(m)))


def test_zero_power_is_the_floor_not_none():
    assert optics.mw_to_dbm(0.0) == optics.POWER_FLOOR_DBM == -40.0
    assert optics.mw_to_dbm(0.0001) == -40.0  # one LSB, 0.1 uW
    assert optics.mw_to_dbm(1.0) == 0.0


# --------------------------------------------------------------------------
# Property: random bytes never raise and never yield a non-finite number
# --------------------------------------------------------------------------

ALL_REFS = [LOWER, A2, P00, P01, P02, P03, P11, PageRef.upper(0x11, bank=1)]
IDENTS = [0x03, 0x0C, 0x0D, 0x11, 0x18, 0x19, 0x1E, 0x00, 0xFF, 0x06]


def numbers(r: OpticsReading):
    yield r.temperature_c
    yield r.voltage_v
    yield from r.tx_bias_ma
    yield from r.tx_power_dbm
    yield from r.rx_power_dbm
    for _, t in r.thresholds:
        yield from (t.high_alarm, t.high_warn, t.low_warn, t.low_alarm)


def check_total(result):
    assert isinstance(result, (OpticsReading, Unreadable))
    if isinstance(result, Unreadable):
        assert result.reason and not result.reason.startswith("internal decode error"), result.reason
    else:
        assert all(math.isfinite(x) for x in numbers(result) if x is not None)


page_bytes = st.one_of(st.binary(min_size=128, max_size=128), st.binary(max_size=160))


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(lower=st.binary(max_size=200), spec=st.sampled_from([SFF8472, SFF8636, CMIS, "bogus"]))
def test_identify_and_pages_needed_are_total(lower, spec):
    ident = optics.identify(lower)
    assert isinstance(ident, (str, Unreadable))
    needed = optics.pages_needed(spec, lower)
    assert isinstance(needed, (list, Unreadable))


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), ident=st.sampled_from(IDENTS))
def test_decode_is_total_on_random_pages(data, ident):
    pages = {}
    for ref in data.draw(st.lists(st.sampled_from(ALL_REFS), unique=True)):
        pages[ref] = data.draw(page_bytes)
    if data.draw(st.booleans()):
        lower = bytearray(data.draw(st.binary(min_size=128, max_size=128)))
        lower[0] = ident
        pages[LOWER] = bytes(lower)
    check_total(optics.decode(pages))


def repair(pages: dict[PageRef, bytes]) -> dict[PageRef, bytes]:
    """Recompute the check codes, so random damage gets past them into the numbers."""
    out = dict(pages)
    ident = out[LOWER][0] if out.get(LOWER) else None
    sums = {0x03: [(LOWER, 0, 62, 63), (LOWER, 64, 94, 95)],
            0x11: [(P00, 128, 190, 191), (P00, 192, 222, 223)],
            0x18: [(P00, 128, 221, 222)]}.get(ident, [])
    for ref, first, last, at in sums:
        if ref in out and len(out[ref]) == 128:
            data = bytearray(out[ref])
            b = ref.offset
            data[at - b] = sum(data[first - b:last - b + 1]) & 0xFF
            out[ref] = bytes(data)
    return out


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), module=st.sampled_from(sorted(MODULES)), fix=st.booleans())
def test_decode_is_total_on_damaged_real_dumps(data, module, fix):
    pages = built(MODULES[module]())
    if module == "sfp" and data.draw(st.booleans()):
        pages = built(sfp_external())
    for _ in range(data.draw(st.integers(1, 6))):
        ref = data.draw(st.sampled_from(sorted(pages)))
        raw = bytearray(pages[ref])
        at = data.draw(st.integers(0, 127))
        raw[at:at + 4] = data.draw(st.binary(min_size=1, max_size=4))
        pages[ref] = bytes(raw[:128])
    if data.draw(st.booleans()):  # random truncation of one page
        ref = data.draw(st.sampled_from(sorted(pages)))
        pages[ref] = pages[ref][:data.draw(st.integers(0, 128))]
    result = optics.decode(repair(pages) if fix else pages)
    check_total(result)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(floats=st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=5, max_size=5),
       slopes=st.binary(min_size=16, max_size=16), raw=st.binary(min_size=10, max_size=10))
def test_external_calibration_is_total(floats, slopes, raw):
    m = sfp_external()
    m[A2].put(56, struct.pack(">5f", *floats).hex())
    m[A2].put(76, slopes.hex())
    m[A2].put(96, raw.hex())
    check_total(optics.decode(built(m)))
