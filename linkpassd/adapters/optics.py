"""Pure decoders from raw module memory pages to ``OpticsReading``.

The ethtool adapter reads a module through ETHTOOL_MSG_MODULE_EEPROM_GET in
128-byte pages addressed by (I2C address, bank, page, offset).  This module
never touches the kernel: it says which pages to read (``identify``,
``pages_needed``) and turns what was read into value types (``decode``).
Keeping the byte-level knowledge here, pure, means every offset and scaling
is tested against hand-built dumps without root or hardware.

Input: a mapping ``{PageRef: bytes}`` of exactly 128 bytes per entry.  The
lower memory is ``PageRef.lower()`` (offset 0); an upper page N is
``PageRef.upper(N, bank)`` (offset 128), so its first byte is byte 128 of
the spec tables.  SFF-8472 diagnostics live at I2C address 0x51 (A2h).

Units (as in ``OpticsReading``): °C, V, mA, dBm.  Raw units: temperature
signed 1/256 °C, voltage 100 µV, bias 2 µA, optical power 0.1 µW.

Decisions (see the module constants):
- 0 mW is reported as ``POWER_FLOOR_DBM`` (-40 dBm = one LSB, 0.1 µW), not
  None: None means "the module does not report it", whereas 0 mW is a real
  and alarming reading (no light) that must still sort below every low
  threshold.  Readings below one LSB (after calibration) clamp to the floor.
- SFF-8472 external calibration (A0h 92 bit 4) is implemented: slope/offset
  for T, V, TX bias, TX power and the Rx_PWR(4..0) polynomial (A2h 56..91),
  applied to readings and thresholds alike (thresholds are "interpreted in
  the same manner as real time data").  Note that ethtool's sfpdiag.c
  multiplies every Rx_PWR(k) by the plain reading instead of reading**k;
  we follow the spec's polynomial.
- Lanes: SFF-8472 one, SFF-8636 four, CMIS up to eight from bank 0 of page
  11h.  Modules with more than eight lanes (banks 1..3) are decoded on their
  first eight lanes only; ``OpticsDetail.banks`` says how many exist.  The
  CMIS lane count comes from application 1 (media lane count, lower byte 88;
  media lane assignment options, page 01h byte 176), so a 4-lane module in
  an 8-lane form factor does not report four dark phantom lanes.
- RX power may be OMA or average power (SFF-8472 A0h 92 bit 3, SFF-8636
  page 00h 220 bit 3, CMIS page 01h 151 bit 4); the thresholds are of the
  same kind, so comparisons hold.  ``OpticsReading`` has no field for it;
  ``decode_detailed`` returns it in ``OpticsDetail.rx_power_type``.
- Thresholds are decoded as the module stores them, even when a block is
  all 0x00 or all 0xFF (an unprogrammed or blank threshold page): its four
  levels then come out equal, which the core reports as "thresholds
  unreadable" and never judges values against (``core.signals``).  Decoding
  such a block to ``Thresholds()`` would make it indistinguishable from a
  module that gives none.  Thresholds out of order (high alarm >= high
  warning >= low warning >= low alarm violated) make the whole reading
  Unreadable: a module that contradicts itself cannot be trusted for the
  rest either.
- Flags are reported only where the module advertises the function, and
  use 0-based lane indexes: ``rx_power_low_alarm[2]``, ``tx_fault[0]``,
  ``rx_los[1]``, ``tx_los[i]``, ``tx_cdr_lol[i]``, ``rx_cdr_lol[i]``,
  ``tx_adaptive_eq_fault[i]``; module-level ``temperature_high_warning``,
  ``voltage_low_alarm``; CMIS ``module_fault`` (module state ModuleFault),
  ``module_firmware_fault`` and ``datapath_firmware_fault`` (lower byte 8
  bits 1 and 2, decoded for flat-memory modules too).
  SFF-8472 TX fault / RX LOS come from the soft status bits (A2h 110), which
  mirror the pins rather than latch.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from linkpassd.core.model import ModuleIdentity, OpticsReading, Thresholds, Unreadable

SFF8472 = "SFF-8472"
SFF8636 = "SFF-8636"
CMIS = "CMIS"

PAGE_SIZE = 128
I2C_A0 = 0x50  # serial ID, and all of SFF-8636 / CMIS
I2C_A2 = 0x51  # SFF-8472 diagnostics

POWER_FLOOR_DBM = -40.0  # 0.1 µW, one LSB: what 0 mW reads as
TEMPERATURE_RANGE_C = (-50.0, 125.0)  # a module sensor outside this is broken
VOLTAGE_RANGE_V = (1.0, 5.0)  # a module answering I2C has some supply; >5 V destroys it
POWER_MAX_DBM = 20.0  # 100 mW: above any pluggable's damage level (raw max is 8.2 dBm)
BIAS_MAX_MA = 1000.0  # raw max is 131 mA, 524 mA with the CMIS x4 multiplier
CMIS_MAX_LANES = 8  # bank 0 of page 11h

# SFF-8024 identifier (byte 0) -> (spec, form factor).  Only the identifiers
# whose memory map we decode; everything else is Unreadable, by design.
_IDENTIFIERS: dict[int, tuple[str, str]] = {
    0x03: (SFF8472, "SFP/SFP+/SFP28"),
    0x0C: (SFF8636, "QSFP"),
    0x0D: (SFF8636, "QSFP+"),
    0x11: (SFF8636, "QSFP28"),
    0x18: (CMIS, "QSFP-DD"),
    0x19: (CMIS, "OSFP"),
    0x1B: (CMIS, "DSFP"),
    0x1E: (CMIS, "QSFP+ (CMIS)"),
    0x1F: (CMIS, "SFP-DD (CMIS)"),
    0x20: (CMIS, "SFP+ (CMIS)"),
    0x21: (CMIS, "OSFP-XD"),
}
_NOT_DECODED = {
    0x00: "unknown or unspecified (no module?)",
    0x01: "GBIC", 0x02: "soldered module", 0x06: "XFP", 0x0B: "DWDM-SFP",
    0x0E: "CXP", 0x12: "CXP2", 0xFF: "all ones (nothing answering?)",
}

_SFF8472_REVISIONS = {0x01: "9.3", 0x02: "9.5", 0x03: "10.2", 0x04: "10.4",
                      0x05: "11.0", 0x06: "11.3", 0x07: "11.4", 0x08: "12.0"}
_SFF8636_REVISIONS = {0x01: "SFF-8436 4.8", 0x02: "SFF-8436 4.8+", 0x03: "1.3",
                      0x04: "1.4", 0x05: "1.5", 0x06: "2.0", 0x07: "2.5-2.7",
                      0x08: "2.8-2.10"}

QUANTITIES = ("temperature_c", "voltage_v", "tx_bias_ma", "tx_power_dbm", "rx_power_dbm")


@dataclass(frozen=True, order=True)
class PageRef:
    """One 128-byte MODULE_EEPROM_GET request: offset 0 is lower memory,
    offset 128 an upper page (selected by page and bank)."""

    i2c: int
    bank: int
    page: int
    offset: int

    @classmethod
    def lower(cls, i2c: int = I2C_A0) -> "PageRef":
        return cls(i2c, 0, 0, 0)

    @classmethod
    def upper(cls, page: int, bank: int = 0, i2c: int = I2C_A0) -> "PageRef":
        return cls(i2c, bank, page, PAGE_SIZE)

    def __str__(self) -> str:
        where = "lower memory" if self.offset == 0 else f"upper page {self.page:02X}h"
        bank = f" bank {self.bank}" if self.bank else ""
        return f"{where}{bank} (i2c 0x{self.i2c:02X})"


@dataclass(frozen=True)
class OpticsDetail:
    """What a decode learned that ``OpticsReading`` has no field for."""

    spec: str
    lanes: int  # lanes decoded (the tuples' length)
    banks: int | None = None  # CMIS lane banks the module advertises (8 lanes each)
    rx_power_type: str | None = None  # "average" or "oma"
    tx_bias_multiplier: int | None = None  # CMIS page 01h 160 bits 4-3
    calibration: str | None = None  # SFF-8472: "internal" or "external"


class _Bad(Exception):
    """Internal: the bytes cannot be trusted; becomes ``Unreadable(reason)``."""


# --------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------


def identify(lower: bytes) -> str | Unreadable:
    """The spec a module speaks, from SFF-8024 byte 0 of its lower memory."""
    try:
        return _identify(lower)[0]
    except _Bad as bad:
        return Unreadable(str(bad))


def pages_needed(spec: str, lower: bytes) -> list[PageRef] | Unreadable:
    """The pages to read after the lower memory, given what it advertises.

    SFF-8472: A2h lower half only (thresholds, calibration, readings and
    flags are all in 0..127; the upper half is user EEPROM), and only when
    DDM is implemented.  SFF-8636: page 00h, plus 03h (thresholds) unless
    flat memory.  CMIS: page 00h, plus 01h (advertising), 02h (thresholds)
    and 11h bank 0 (lane flags and monitors) unless flat memory.
    """
    try:
        _check_page(lower, PageRef.lower())
        return _pages_needed(spec, lower)
    except _Bad as bad:
        return Unreadable(str(bad))


def decode(pages: Mapping[PageRef, bytes]) -> OpticsReading | Unreadable:
    """Decode a module's pages; never raises on bad input."""
    result = decode_detailed(pages)
    return result if isinstance(result, Unreadable) else result[0]


def decode_detailed(pages: Mapping[PageRef, bytes]) -> tuple[OpticsReading, OpticsDetail] | Unreadable:
    """``decode``, plus the facts the value type cannot carry (RX power kind, lanes)."""
    try:
        return _decode(pages)
    except _Bad as bad:
        return Unreadable(str(bad))
    except (IndexError, ValueError, struct.error, OverflowError, TypeError, AttributeError) as exc:
        # A decoder bug must not take the sensor loop down; tests assert this never fires.
        return Unreadable(f"internal decode error: {exc!r}")


# --------------------------------------------------------------------------
# Dispatch and checks
# --------------------------------------------------------------------------


def _identify(lower: bytes) -> tuple[str, str]:
    _check_page(lower, PageRef.lower())
    ident = lower[0]
    if ident in _IDENTIFIERS:
        return _IDENTIFIERS[ident]
    what = _NOT_DECODED.get(ident, "not a module type this decoder knows")
    if 0x80 <= ident <= 0xFE:
        what = "vendor specific"
    raise _Bad(f"identifier 0x{ident:02X} ({what}) is not a supported module")


def _pages_needed(spec: str, lower: bytes) -> list[PageRef]:
    if spec == SFF8472:
        return [PageRef.lower(I2C_A2)] if _sff8472_dom(lower) else []
    if spec == SFF8636:
        flat = bool(lower[2] & 0x04)
        return [PageRef.upper(0x00)] + ([] if flat else [PageRef.upper(0x03)])
    if spec == CMIS:
        flat = bool(lower[2] & 0x80)
        return [PageRef.upper(0x00)] + ([] if flat else [
            PageRef.upper(0x01), PageRef.upper(0x02), PageRef.upper(0x11, bank=0)])
    raise _Bad(f"unknown spec {spec!r}")


def _check_page(data: object, ref: PageRef) -> bytes:
    if not isinstance(data, (bytes, bytearray)):
        raise _Bad(f"{ref}: expected bytes, got {type(data).__name__}")
    if len(data) < PAGE_SIZE:
        raise _Bad(f"{ref}: truncated page, {len(data)} of {PAGE_SIZE} bytes")
    if len(data) > PAGE_SIZE:
        raise _Bad(f"{ref}: {len(data)} bytes where one page is {PAGE_SIZE}")
    return bytes(data)


def _page(pages: Mapping[PageRef, bytes], ref: PageRef) -> bytes:
    if ref not in pages:
        raise _Bad(f"missing required page: {ref}")
    return _check_page(pages[ref], ref)


def _decode(pages: Mapping[PageRef, bytes]) -> tuple[OpticsReading, OpticsDetail]:
    if not isinstance(pages, Mapping):
        raise _Bad(f"expected a mapping of pages, got {type(pages).__name__}")
    lower = _page(pages, PageRef.lower())
    spec, form_factor = _identify(lower)
    got = {ref: _page(pages, ref) for ref in _pages_needed(spec, lower)}
    if spec == SFF8472:
        reading, detail = _decode_sff8472(lower, got, form_factor)
    elif spec == SFF8636:
        reading, detail = _decode_sff8636(lower, got, form_factor)
    else:
        reading, detail = _decode_cmis(lower, got, form_factor)
    _check_plausible(reading)
    return reading, detail


def _check_plausible(reading: OpticsReading) -> None:
    """Reject what no working sensor can report: non-finite or impossible values."""
    for name in QUANTITIES:
        value = getattr(reading, name)
        for v in value if isinstance(value, tuple) else (value,):
            if v is not None and not math.isfinite(v):
                raise _Bad(f"{name} is not finite ({v})")
        for level, v in vars(reading.threshold(name)).items():
            if v is not None and not math.isfinite(v):
                raise _Bad(f"{name} {level} threshold is not finite ({v})")
    t = reading.temperature_c
    if t is not None and not TEMPERATURE_RANGE_C[0] <= t <= TEMPERATURE_RANGE_C[1]:
        raise _Bad(f"temperature {t:g} C is impossible (outside {TEMPERATURE_RANGE_C[0]:g}"
                   f"..{TEMPERATURE_RANGE_C[1]:g} C)")
    v = reading.voltage_v
    if v is not None and not VOLTAGE_RANGE_V[0] <= v <= VOLTAGE_RANGE_V[1]:
        raise _Bad(f"supply voltage {v:g} V is impossible (outside {VOLTAGE_RANGE_V[0]:g}"
                   f"..{VOLTAGE_RANGE_V[1]:g} V)")
    for name, limit, unit in (("tx_power_dbm", POWER_MAX_DBM, "dBm"),
                              ("rx_power_dbm", POWER_MAX_DBM, "dBm"),
                              ("tx_bias_ma", BIAS_MAX_MA, "mA")):
        for lane, x in enumerate(getattr(reading, name)):
            if x is not None and x > limit:
                raise _Bad(f"{name}[{lane}] {x:g} {unit} is impossible (above {limit:g} {unit})")


# --------------------------------------------------------------------------
# Field helpers (offsets are the spec's byte numbers within `data`)
# --------------------------------------------------------------------------


def _u16(data: bytes, at: int) -> int:
    return (data[at] << 8) | data[at + 1]


def _s16(data: bytes, at: int) -> int:
    raw = _u16(data, at)
    return raw - 0x10000 if raw & 0x8000 else raw


def _checksum(data: bytes, first: int, last: int, at: int, name: str) -> None:
    """Low 8 bits of the sum of bytes first..last must equal byte `at`."""
    want = sum(data[first:last + 1]) & 0xFF
    if data[at] != want:
        raise _Bad(f"{name} checksum mismatch at byte {at}: stored 0x{data[at]:02X}, "
                   f"bytes {first}-{last} sum to 0x{want:02X}")


def _text(data: bytes, first: int, last: int, name: str) -> str:
    """An ASCII field, space (or NUL) padded; anything unprintable is garbage."""
    raw = data[first:last + 1].rstrip(b" \x00")
    bad = [b for b in raw if not 0x20 <= b <= 0x7E]
    if bad:
        raise _Bad(f"unprintable {name} (byte 0x{bad[0]:02X} in bytes {first}-{last})")
    return raw.decode("ascii")


def _temp_c(raw: int | float) -> float:
    return raw / 256.0


def _volts(raw: int | float) -> float:
    return raw * 100e-6


def _bias_ma(raw: int | float) -> float:
    return raw * 2e-3


def _power_mw(raw: int | float) -> float:
    return raw * 1e-4


def mw_to_dbm(mw: float) -> float:
    """dBm, with 0 mW (and anything under one 0.1 µW LSB) at ``POWER_FLOOR_DBM``."""
    if not math.isfinite(mw):
        return mw
    if mw <= 1e-4:
        return POWER_FLOOR_DBM
    return 10.0 * math.log10(mw)


def _thresholds(quantity: str, values: tuple[float, float, float, float]) -> Thresholds:
    """Module levels in the spec's (high alarm, low alarm, high warn, low warn)
    order, in physical units.  A blank block (all 0x00 or 0xFF) is returned
    as its four equal levels, not dropped: see the module docstring."""
    ha, la, hw, lw = values
    if any(not math.isfinite(v) for v in values):
        raise _Bad(f"{quantity} thresholds are not finite ({ha}, {la}, {hw}, {lw})")
    for (upper, u), (lower_, lo) in ((("high_alarm", ha), ("low_alarm", la)),
                                     (("high_alarm", ha), ("high_warn", hw)),
                                     (("high_warn", hw), ("low_warn", lw)),
                                     (("low_warn", lw), ("low_alarm", la))):
        if u < lo:
            raise _Bad(f"{quantity} thresholds out of order (inverted): "
                       f"{upper} {u:g} < {lower_} {lo:g}")
    if quantity.endswith("_dbm"):
        ha, la, hw, lw = (mw_to_dbm(x) for x in (ha, la, hw, lw))
    return Thresholds(high_alarm=ha, high_warn=hw, low_warn=lw, low_alarm=la)


def _threshold_block(data: bytes, at: int, signed: bool = False) -> tuple[int, int, int, int]:
    read = _s16 if signed else _u16
    return tuple(read(data, at + 2 * i) for i in range(4))  # type: ignore[return-value]


_LEVELS = ("high_alarm", "low_alarm", "high_warning", "low_warning")


def _bit(byte: int, n: int) -> bool:
    return bool(byte >> n & 1)


# --------------------------------------------------------------------------
# SFF-8472 (SFP): A0h serial ID, A2h diagnostics
# --------------------------------------------------------------------------


def _sff8472_dom(a0: bytes) -> bool:
    """DDM implemented (92 bit 6) and reachable without the address-change
    sequence (92 bit 2), which ethtool's MODULE_EEPROM_GET cannot perform."""
    return _bit(a0[92], 6) and not _bit(a0[92], 2)


@dataclass(frozen=True)
class _Cal:
    """SFF-8472 external calibration constants (A2h 56..91); identity when internal."""

    rx: tuple[float, float, float, float, float] = (0.0, 1.0, 0.0, 0.0, 0.0)  # Rx_PWR(0..4)
    bias: tuple[float, int] = (1.0, 0)
    tx: tuple[float, int] = (1.0, 0)
    temp: tuple[float, int] = (1.0, 0)
    volt: tuple[float, int] = (1.0, 0)

    @staticmethod
    def read(a2: bytes) -> "_Cal":
        def slope_offset(at: int) -> tuple[float, int]:
            # slope: unsigned 8.8 fixed point; offset: signed, in the result's units
            return a2[at] + a2[at + 1] / 256.0, _s16(a2, at + 2)

        # Rx_PWR(4) at 56 down to Rx_PWR(0) at 72, IEEE-754 single, big-endian
        rx4, rx3, rx2, rx1, rx0 = struct.unpack(">5f", a2[56:76])
        coeffs = (rx0, rx1, rx2, rx3, rx4)
        if not all(math.isfinite(c) for c in coeffs):
            raise _Bad(f"externally calibrated module has non-finite Rx_PWR constants "
                       f"(A2h 56-75): {coeffs}")
        return _Cal(rx=coeffs, bias=slope_offset(76), tx=slope_offset(80),
                    temp=slope_offset(84), volt=slope_offset(88))

    @staticmethod
    def linear(so: tuple[float, int], raw: int) -> float:
        return so[0] * raw + so[1]

    def rx_power(self, raw: int) -> float:
        return sum(c * float(raw) ** k for k, c in enumerate(self.rx))


def _decode_sff8472(a0: bytes, got: dict[PageRef, bytes],
                    form_factor: str) -> tuple[OpticsReading, OpticsDetail]:
    _checksum(a0, 0, 62, 63, "CC_BASE (A0h)")
    _checksum(a0, 64, 94, 95, "CC_EXT (A0h)")
    identity = ModuleIdentity(
        spec=SFF8472, form_factor=form_factor,
        vendor=_text(a0, 20, 35, "vendor name"),
        part=_text(a0, 40, 55, "part number"),
        serial=_text(a0, 68, 83, "serial number"),
        revision=_text(a0, 56, 59, "revision"),
        spec_revision=_SFF8472_REVISIONS.get(a0[94], f"0x{a0[94]:02X}" if a0[94] else ""),
    )
    diag = a0[92]
    rx_type = "average" if _bit(diag, 3) else "oma"
    if not _sff8472_dom(a0):
        return (OpticsReading(identity=identity, tx_bias_ma=(None,), tx_power_dbm=(None,),
                              rx_power_dbm=(None,)),
                OpticsDetail(SFF8472, lanes=1, rx_power_type=None))
    internal, external = _bit(diag, 5), _bit(diag, 4)
    if internal and external:
        raise _Bad("A0h 92 claims both internal and external calibration (bits 5 and 4)")
    a2 = got[PageRef.lower(I2C_A2)]
    if a2[110] & 0x01:
        raise _Bad("data not ready (A2h 110 bit 0, Data_Ready_Bar): readings are not valid yet")
    cal = _Cal.read(a2) if external else _Cal()

    def finite(x: float, what: str) -> float:
        if not math.isfinite(x):
            raise _Bad(f"{what} is not finite after external calibration ({x})")
        return x

    # Calibrated bias and powers may dip below zero near the origin: clamp, they are magnitudes.
    def temp(raw: int) -> float:
        return _temp_c(finite(_Cal.linear(cal.temp, raw), "temperature"))

    def volt(raw: int) -> float:
        return _volts(finite(_Cal.linear(cal.volt, raw), "supply voltage"))

    def bias(raw: int) -> float:
        return _bias_ma(max(0.0, finite(_Cal.linear(cal.bias, raw), "TX bias")))

    def tx(raw: int) -> float:
        return _power_mw(max(0.0, finite(_Cal.linear(cal.tx, raw), "TX power")))

    def rx(raw: int) -> float:
        return _power_mw(max(0.0, finite(cal.rx_power(raw), "RX power")))

    blocks = (
        ("temperature_c", _threshold_block(a2, 0, signed=True), temp),
        ("voltage_v", _threshold_block(a2, 8), volt),
        ("tx_bias_ma", _threshold_block(a2, 16), bias),
        ("tx_power_dbm", _threshold_block(a2, 24), tx),
        ("rx_power_dbm", _threshold_block(a2, 32), rx),
    )
    thresholds = tuple(
        (name, _thresholds(name, tuple(conv(r) for r in raw)))  # type: ignore[arg-type]
        for name, raw, conv in blocks)

    flags: set[str] = set()
    enh = a0[93]
    if _bit(enh, 7):  # alarm and warning flags implemented
        for kind, at in (("alarm", 112), ("warning", 116)):
            b0, b1 = a2[at], a2[at + 1]
            for bit, quantity, lane in ((7, "temperature_high", False), (6, "temperature_low", False),
                                        (5, "voltage_high", False), (4, "voltage_low", False),
                                        (3, "tx_bias_high", True), (2, "tx_bias_low", True),
                                        (1, "tx_power_high", True), (0, "tx_power_low", True)):
                if _bit(b0, bit):
                    flags.add(f"{quantity}_{kind}" + ("[0]" if lane else ""))
            if _bit(b1, 7):
                flags.add(f"rx_power_high_{kind}[0]")
            if _bit(b1, 6):
                flags.add(f"rx_power_low_{kind}[0]")
    if _bit(enh, 5) and _bit(a2[110], 2):
        flags.add("tx_fault[0]")
    if _bit(enh, 4) and _bit(a2[110], 1):
        flags.add("rx_los[0]")

    reading = OpticsReading(
        identity=identity,
        temperature_c=temp(_s16(a2, 96)),
        voltage_v=volt(_u16(a2, 98)),
        tx_bias_ma=(bias(_u16(a2, 100)),),
        tx_power_dbm=(mw_to_dbm(tx(_u16(a2, 102))),),
        rx_power_dbm=(mw_to_dbm(rx(_u16(a2, 104))),),
        thresholds=thresholds,
        flags=frozenset(flags),
    )
    return reading, OpticsDetail(SFF8472, lanes=1, rx_power_type=rx_type,
                                 calibration="external" if external else "internal")


# --------------------------------------------------------------------------
# SFF-8636 (QSFP+/QSFP28): lower page, page 00h, page 03h
# --------------------------------------------------------------------------


def _lane_flags(byte: int, name: str, first_lane: int = 0, lanes: int = 4, shift: int = 0) -> set[str]:
    return {f"{name}[{first_lane + i}]" for i in range(lanes) if _bit(byte, shift + i)}


def _decode_sff8636(lower: bytes, got: dict[PageRef, bytes],
                    form_factor: str) -> tuple[OpticsReading, OpticsDetail]:
    p00 = lower + got[PageRef.upper(0x00)]
    if p00[128] != lower[0]:
        raise _Bad(f"identifier mismatch: lower byte 0 is 0x{lower[0]:02X}, "
                   f"page 00h byte 128 is 0x{p00[128]:02X}")
    _checksum(p00, 128, 190, 191, "CC_BASE (page 00h)")
    _checksum(p00, 192, 222, 223, "CC_EXT (page 00h)")
    rev = lower[1]
    identity = ModuleIdentity(
        spec=SFF8636, form_factor=form_factor,
        vendor=_text(p00, 148, 163, "vendor name"),
        part=_text(p00, 168, 183, "part number"),
        serial=_text(p00, 196, 211, "serial number"),
        revision=_text(p00, 184, 185, "revision"),
        spec_revision=_SFF8636_REVISIONS.get(rev, f"0x{rev:02X}" if rev else ""),
    )
    if lower[2] & 0x01:
        raise _Bad("data not ready (lower byte 2 bit 0, Data_Not_Ready): readings are not valid yet")
    flat = bool(lower[2] & 0x04)
    diag = p00[220]
    temp_ok, volt_ok, tx_ok = _bit(diag, 5), _bit(diag, 4), _bit(diag, 2)
    rx_type = "average" if _bit(diag, 3) else "oma"  # clear also means "not supported"

    lanes = range(4)
    if flat:  # passive copper by convention: lane monitors read as zeros, not light
        bias = tx = rx = (None,) * 4
    else:
        rx = tuple(mw_to_dbm(_power_mw(_u16(lower, 34 + 2 * i))) for i in lanes)
        bias = tuple(_bias_ma(_u16(lower, 42 + 2 * i)) for i in lanes)
        tx = (tuple(mw_to_dbm(_power_mw(_u16(lower, 50 + 2 * i))) for i in lanes)
              if tx_ok else (None,) * 4)

    thresholds: list[tuple[str, Thresholds]] = []
    if not flat:
        p03 = lower + got[PageRef.upper(0x03)]
        blocks = [("temperature_c", 128, True, _temp_c, temp_ok),
                  ("voltage_v", 144, False, _volts, volt_ok),
                  ("rx_power_dbm", 176, False, _power_mw, True),
                  ("tx_bias_ma", 184, False, _bias_ma, True),
                  ("tx_power_dbm", 192, False, _power_mw, tx_ok)]
        for name, at, signed, conv, supported in blocks:
            if supported:
                raw = _threshold_block(p03, at, signed)
                thresholds.append((name, _thresholds(name, tuple(conv(r) for r in raw))))  # type: ignore[arg-type]

    flags: set[str] = set()
    opt3, opt4 = p00[194], p00[195]
    flags |= _lane_flags(lower[3], "rx_los")  # no RX LOS support bit exists; always defined
    if _bit(opt4, 1):
        flags |= _lane_flags(lower[3], "tx_los", shift=4)
    if _bit(opt4, 3):
        flags |= _lane_flags(lower[4], "tx_fault")
    if _bit(p00[193], 3):
        flags |= _lane_flags(lower[4], "tx_adaptive_eq_fault", shift=4)
    if _bit(opt3, 4):
        flags |= _lane_flags(lower[5], "rx_cdr_lol")
    if _bit(opt3, 5):
        flags |= _lane_flags(lower[5], "tx_cdr_lol", shift=4)
    for at, quantity, supported in ((6, "temperature", temp_ok), (7, "voltage", volt_ok)):
        if supported:
            for bit, level in zip((7, 6, 5, 4), _LEVELS):
                if _bit(lower[at], bit):
                    flags.add(f"{quantity}_{level}")
    if not flat:
        # two lanes per byte: lane 2k in bits 7-4, lane 2k+1 in bits 3-0 (HA, LA, HW, LW)
        for at, quantity, supported in ((9, "rx_power", True), (11, "tx_bias", True),
                                        (13, "tx_power", tx_ok)):
            if not supported:
                continue
            for k in range(2):
                byte = lower[at + k]
                for half, lane in ((4, 2 * k), (0, 2 * k + 1)):
                    for bit, level in zip((3, 2, 1, 0), _LEVELS):
                        if _bit(byte, half + bit):
                            flags.add(f"{quantity}_{level}[{lane}]")

    reading = OpticsReading(
        identity=identity,
        temperature_c=_temp_c(_s16(lower, 22)) if temp_ok else None,
        voltage_v=_volts(_u16(lower, 26)) if volt_ok else None,
        tx_bias_ma=bias, tx_power_dbm=tx, rx_power_dbm=rx,
        thresholds=tuple(thresholds), flags=frozenset(flags),
    )
    return reading, OpticsDetail(SFF8636, lanes=4, rx_power_type=None if flat else rx_type)


# --------------------------------------------------------------------------
# CMIS (QSFP-DD, OSFP, ...): lower page, pages 00h, 01h, 02h, 11h bank 0
# --------------------------------------------------------------------------

_CMIS_MODULE_STATES = {1: "ModuleLowPwr", 2: "ModulePwrUp", 3: "ModuleReady",
                       4: "ModulePwrDn", 5: "ModuleFault"}


def _cmis_lanes(lower: bytes, p01: bytes) -> list[int]:
    """Media lanes in use by application 1: every lane its media lane count
    covers from each allowed start lane.  Unadvertised: all eight."""
    count = lower[88] & 0x0F
    starts = p01[176]
    if not count or not starts:
        return list(range(CMIS_MAX_LANES))
    used = {s + i for s in range(CMIS_MAX_LANES) if _bit(starts, s) for i in range(count)}
    return sorted(lane for lane in used if lane < CMIS_MAX_LANES)


def _decode_cmis(lower: bytes, got: dict[PageRef, bytes],
                 form_factor: str) -> tuple[OpticsReading, OpticsDetail]:
    p00 = lower + got[PageRef.upper(0x00)]
    if p00[128] != lower[0]:
        raise _Bad(f"identifier mismatch: lower byte 0 is 0x{lower[0]:02X}, "
                   f"page 00h byte 128 is 0x{p00[128]:02X}")
    _checksum(p00, 128, 221, 222, "page 00h")
    major, minor = lower[1] >> 4, lower[1] & 0x0F
    if not 3 <= major <= 5:
        raise _Bad(f"CMIS revision {major}.{minor} (lower byte 1) is not supported "
                   "(memory map verified for CMIS 3.x-5.x)")
    identity = ModuleIdentity(
        spec=CMIS, form_factor=form_factor,
        vendor=_text(p00, 129, 144, "vendor name"),
        part=_text(p00, 148, 163, "part number"),
        serial=_text(p00, 166, 181, "serial number"),
        revision=_text(p00, 164, 165, "revision"),
        spec_revision=f"{major}.{minor}",
    )
    flags: set[str] = set()
    if _CMIS_MODULE_STATES.get((lower[3] >> 1) & 0x07) == "ModuleFault":
        flags.add("module_fault")
    # lower byte 8 (module flags, latched): bit 1 ModuleFirmwareError, bit 2
    # DataPathFirmwareError; bit 0 (state changed) is no fault.  Flat-memory
    # modules have a lower page too, so these count for them as well.
    if _bit(lower[8], 1):
        flags.add("module_firmware_fault")
    if _bit(lower[8], 2):
        flags.add("datapath_firmware_fault")
    if lower[2] & 0x80:  # flat memory: no advertising page, so no monitor we can trust
        return (OpticsReading(identity=identity, flags=frozenset(flags)),
                OpticsDetail(CMIS, lanes=0))

    p01 = lower + got[PageRef.upper(0x01)]
    p02 = lower + got[PageRef.upper(0x02)]
    p11 = lower + got[PageRef.upper(0x11, bank=0)]
    banks = {0: 1, 1: 2, 2: 4}.get(p01[142] & 0x03)
    mod_mon, lane_mon = p01[159], p01[160]
    temp_ok, volt_ok = _bit(mod_mon, 0), _bit(mod_mon, 1)
    bias_ok, tx_ok, rx_ok = _bit(lane_mon, 0), _bit(lane_mon, 1), _bit(lane_mon, 2)
    scale_code = (lane_mon >> 3) & 0x03
    if scale_code == 3:
        raise _Bad("TX bias scaling factor 11b (page 01h byte 160 bits 4-3) is reserved")
    multiplier = 1 << scale_code
    rx_type = "average" if _bit(p01[151], 4) else "oma"

    used = _cmis_lanes(lower, p01)
    n = used[-1] + 1 if used else 0

    def per_lane(at: int, supported: bool, conv) -> tuple[float | None, ...]:
        return tuple(conv(_u16(p11, at + 2 * i)) if supported and i in used else None
                     for i in range(n))

    tx = per_lane(154, tx_ok, lambda r: mw_to_dbm(_power_mw(r)))
    bias = per_lane(170, bias_ok, lambda r: _bias_ma(r * multiplier))
    rx = per_lane(186, rx_ok, lambda r: mw_to_dbm(_power_mw(r)))

    thresholds: list[tuple[str, Thresholds]] = []
    for name, at, signed, conv, supported in (
            ("temperature_c", 128, True, _temp_c, temp_ok),
            ("voltage_v", 136, False, _volts, volt_ok),
            ("tx_power_dbm", 176, False, _power_mw, tx_ok),
            ("tx_bias_ma", 184, False, lambda r: _bias_ma(r * multiplier), bias_ok),
            ("rx_power_dbm", 192, False, _power_mw, rx_ok)):
        if supported:
            raw = _threshold_block(p02, at, signed)
            thresholds.append((name, _thresholds(name, tuple(conv(r) for r in raw))))  # type: ignore[arg-type]

    # module-level: lower byte 9, temperature bits 0-3, voltage bits 4-7 (HA, LA, HW, LW)
    for quantity, base, supported in (("temperature", 0, temp_ok), ("voltage", 4, volt_ok)):
        if supported:
            for i, level in enumerate(_LEVELS):
                if _bit(lower[9], base + i):
                    flags.add(f"{quantity}_{level}")

    def lane_byte(at: int, name: str, supported: bool) -> None:
        if supported:
            flags.update(f"{name}[{i}]" for i in used if _bit(p11[at], i))

    tx_adv, rx_adv = p01[157], p01[158]
    lane_byte(135, "tx_fault", _bit(tx_adv, 0))
    lane_byte(136, "tx_los", _bit(tx_adv, 1))
    lane_byte(137, "tx_cdr_lol", _bit(tx_adv, 2))
    lane_byte(138, "tx_adaptive_eq_fault", _bit(tx_adv, 3))
    lane_byte(147, "rx_los", _bit(rx_adv, 1))
    lane_byte(148, "rx_cdr_lol", _bit(rx_adv, 2))
    for base, quantity, supported in ((139, "tx_power", tx_ok), (143, "tx_bias", bias_ok),
                                      (149, "rx_power", rx_ok)):
        for i, level in enumerate(_LEVELS):
            lane_byte(base + i, f"{quantity}_{level}", supported)

    reading = OpticsReading(
        identity=identity,
        temperature_c=_temp_c(_s16(lower, 14)) if temp_ok else None,
        voltage_v=_volts(_u16(lower, 16)) if volt_ok else None,
        tx_bias_ma=bias, tx_power_dbm=tx, rx_power_dbm=rx,
        thresholds=tuple(thresholds), flags=frozenset(flags),
    )
    return reading, OpticsDetail(CMIS, lanes=n, banks=banks, rx_power_type=rx_type,
                                 tx_bias_multiplier=multiplier)
