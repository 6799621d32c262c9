"""Lab-only sensor backend: simulated optics and counters from files.

Veth ports have no module EEPROM, so labs write one JSON file per port
(``<run_dir>/sim/<port>.json``, format ``linkpass.simsensor/1`` in
labs/simsensor.md) and linkpassd reads it here instead of asking
ethtool.  The answers are the same value types as ``EthtoolSensor``'s, so
health, policy and routing run their production code on them.  A file may
carry the module's raw EEPROM pages instead of decoded values (``eeprom``):
those go through the production decoders (linkpassd.adapters.optics), so a
lab exercises byte-level module behaviour (flags, blank thresholds, flat
memory) end to end.

Each call opens, reads and parses the file afresh: the writer renames a
complete temporary file over the old one, so one open() sees one whole
reading, and a reader that kept the file open would keep the old inode.
The files are small and local, so reading them inline is cheaper than a
thread hop.  A missing, torn, malformed or contradictory file is a sensor
answer (``Unreadable``, or a CounterSample with every field None), never an
exception.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import structlog

from linkpassd.adapters import optics as decoders
from linkpassd.core.model import CounterSample, ModuleIdentity, OpticsReading, Thresholds, Unreadable

log = structlog.get_logger("linkpassd.simsensor")

SCHEMA = "linkpass.simsensor/1"
MAX_FILE_BYTES = 1 << 20  # a reading is ~2 KiB; anything this large is not one
MAX_LANES = 32  # CMIS: up to 4 banks of 8 lanes

QUANTITIES = ("temperature_c", "voltage_v", "tx_bias_ma", "tx_power_dbm", "rx_power_dbm")
LANE_QUANTITIES = ("tx_bias_ma", "tx_power_dbm", "rx_power_dbm")
# file key -> Thresholds field
THRESHOLD_KEYS = (
    ("high_alarm", "high_alarm"),
    ("high_warning", "high_warn"),
    ("low_warning", "low_warn"),
    ("low_alarm", "low_alarm"),
)
# file key -> CounterSample field
COUNTER_KEYS = (
    ("fec_corrected", "fec_corrected"),
    ("fec_uncorrectable", "fec_uncorrectable"),
    ("rx_crc_errors", "rx_crc_errors"),
    ("link_down_count", "link_down_events"),
)


class _Bad(Exception):
    """The document is not a trustworthy reading; the message says why."""


def _reject_constant(name: str):
    raise ValueError(f"non-finite number {name}")


def parse_document(data: bytes, port: str) -> dict[str, Any] | Unreadable:
    """Bytes of one file -> the JSON object, checked for schema and port."""
    try:
        doc = json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError as e:
        return Unreadable(f"{port}: simulated sensor file is not UTF-8: {e}")
    except (ValueError, RecursionError) as e:
        return Unreadable(f"{port}: simulated sensor file is not valid JSON: {e}")
    if not isinstance(doc, dict):
        return Unreadable(f"{port}: simulated sensor file holds {_type(doc)}, not an object")
    if doc.get("schema") != SCHEMA:
        return Unreadable(f"{port}: simulated sensor schema is {doc.get('schema')!r}, not {SCHEMA!r}")
    if doc.get("port") != port:
        return Unreadable(f"{port}: simulated sensor file is for port {doc.get('port')!r}")
    try:
        if "written_at" in doc:
            _number(doc["written_at"], "written_at")
        if "sequence" in doc:
            _integer(doc["sequence"], "sequence")
    except _Bad as e:
        return Unreadable(f"{port}: {e}")
    return doc


def counters_from_document(port: str, doc: dict[str, Any]) -> CounterSample | Unreadable:
    """Counters as written (a counter the file leaves out is None).  Values
    are passed on as read, negative or huge: the core judges them."""
    counters = doc.get("counters")
    if counters is None:
        return CounterSample(port=port)
    if not isinstance(counters, dict):
        return Unreadable(f"{port}: counters is {_type(counters)}, not an object")
    fields = {}
    try:
        for key, field in COUNTER_KEYS:
            if counters.get(key) is not None:
                fields[field] = _integer(counters[key], f"counters.{key}")
    except _Bad as e:
        return Unreadable(f"{port}: {e}")
    return CounterSample(port=port, **fields)


def optics_from_document(port: str, doc: dict[str, Any]) -> OpticsReading | Unreadable:
    try:
        if "eeprom" in doc:
            decoded = _optics_from_eeprom(doc)
            return (Unreadable(f"{port}: module EEPROM: {decoded.reason}")
                    if isinstance(decoded, Unreadable) else decoded)
        return _optics(doc)
    except _Bad as e:
        return Unreadable(f"{port}: {e}")


EEPROM_I2C = (decoders.I2C_A0, decoders.I2C_A2)
DECODED_FIELDS = ("module", *QUANTITIES, "thresholds")


def eeprom_pages(raw) -> dict[decoders.PageRef, bytes]:
    """The ``eeprom`` array -> ``{PageRef: bytes}``, each entry checked and
    named by its index; the decoders check the page contents themselves."""
    if not isinstance(raw, list):
        raise _Bad(f"eeprom is {_type(raw)}, not an array of pages")
    if not raw:
        raise _Bad("eeprom is an empty array: no pages")
    pages: dict[decoders.PageRef, bytes] = {}
    for i, entry in enumerate(raw):
        where = f"eeprom[{i}]"
        if not isinstance(entry, dict):
            raise _Bad(f"{where} is {_type(entry)}, not an object")
        unknown = sorted(set(entry) - {"i2c", "bank", "page", "offset", "hex"})
        if unknown:
            raise _Bad(f"{where} has unknown key {unknown[0]!r}")
        i2c = _integer(entry.get("i2c", decoders.I2C_A0), f"{where}.i2c")
        bank = _integer(entry.get("bank", 0), f"{where}.bank")
        page = _integer(entry.get("page"), f"{where}.page")
        offset = _integer(entry.get("offset"), f"{where}.offset")
        if i2c not in EEPROM_I2C:
            raise _Bad(f"{where}.i2c {i2c} is not 80 (0x50) or 81 (0x51)")
        if not 0 <= bank <= 255 or not 0 <= page <= 255:
            raise _Bad(f"{where}: bank {bank} / page {page} not in 0..255")
        if offset not in (0, decoders.PAGE_SIZE):
            raise _Bad(f"{where}.offset {offset} is not 0 (lower memory) or 128 (upper page)")
        text = _text(entry.get("hex"), f"{where}.hex")
        try:
            data = bytes.fromhex(text)
        except ValueError as e:
            raise _Bad(f"{where}.hex is not hexadecimal: {e}") from None
        if len(data) != decoders.PAGE_SIZE:
            raise _Bad(f"{where}.hex holds {len(data)} bytes, a page is {decoders.PAGE_SIZE}")
        ref = decoders.PageRef(i2c, bank, page, offset)
        if ref in pages:
            raise _Bad(f"{where} repeats {ref}")
        pages[ref] = data
    return pages


def _optics_from_eeprom(doc: dict[str, Any]) -> OpticsReading | Unreadable:
    both = [k for k in DECODED_FIELDS if k in doc]
    if both:
        raise _Bad(f"eeprom and decoded field {both[0]!r} both given: a file holds one or the other")
    return decoders.decode(eeprom_pages(doc["eeprom"]))


def _optics(doc: dict[str, Any]) -> OpticsReading:
    module = doc.get("module")
    if not isinstance(module, dict):
        raise _Bad(f"module is {_type(module)}, not an object")
    spec_text = _text(module.get("spec"), "module.spec")
    spec, _, spec_revision = spec_text.strip().partition(" ")
    identity = ModuleIdentity(
        spec=spec,
        form_factor=_text(module.get("identifier"), "module.identifier"),
        vendor=_text(module.get("vendor"), "module.vendor"),
        part=_text(module.get("part", ""), "module.part"),
        serial=_text(module.get("serial", ""), "module.serial"),
        revision=_text(module.get("revision", ""), "module.revision"),
        spec_revision=spec_revision.strip(),
    )
    lanes = _integer(module.get("lanes"), "module.lanes")
    if not 1 <= lanes <= MAX_LANES:
        raise _Bad(f"module.lanes {lanes} not in 1..{MAX_LANES}")
    per_lane = {}
    for name in LANE_QUANTITIES:
        values = doc.get(name)
        if not isinstance(values, list):
            raise _Bad(f"{name} is {_type(values)}, not an array")
        if len(values) != lanes:
            raise _Bad(f"{name} has {len(values)} lanes, module.lanes says {lanes}")
        per_lane[name] = tuple(
            None if v is None else _number(v, f"{name}[{i}]") for i, v in enumerate(values)
        )
    return OpticsReading(
        identity=identity,
        temperature_c=_number(doc.get("temperature_c"), "temperature_c"),
        voltage_v=_number(doc.get("voltage_v"), "voltage_v"),
        tx_bias_ma=per_lane["tx_bias_ma"],
        tx_power_dbm=per_lane["tx_power_dbm"],
        rx_power_dbm=per_lane["rx_power_dbm"],
        thresholds=_thresholds(doc.get("thresholds", {})),
        # The simulated module publishes no latched flags (tx_fault, rx_los);
        # the core compares values with the thresholds itself.
        flags=frozenset(),
    )


def _thresholds(raw) -> tuple[tuple[str, Thresholds], ...]:
    if not isinstance(raw, dict):
        raise _Bad(f"thresholds is {_type(raw)}, not an object")
    out = []
    for quantity in QUANTITIES:  # other keys: a newer writer's; ignored
        levels = raw.get(quantity)
        if levels is None:
            continue
        if not isinstance(levels, dict):
            raise _Bad(f"thresholds.{quantity} is {_type(levels)}, not an object")
        values = {
            field: None if levels.get(key) is None
            else _number(levels[key], f"thresholds.{quantity}.{key}")
            for key, field in THRESHOLD_KEYS
        }
        ladder = [values[f] for f in ("low_alarm", "low_warn", "high_warn", "high_alarm")
                  if values[f] is not None]
        if ladder != sorted(ladder):
            raise _Bad(f"thresholds.{quantity} out of order (low alarm <= low warning <= "
                       f"high warning <= high alarm): {values}")
        out.append((quantity, Thresholds(**values)))
    return tuple(out)


_KINDS = {type(None): "null", bool: "a boolean", int: "an integer", float: "a fraction",
          str: "a string", list: "an array", dict: "an object"}


def _type(value) -> str:
    """The JSON kind of a value, for reasons a lab user can read."""
    return _KINDS.get(type(value), type(value).__name__)


def _number(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Bad(f"{where} is {_type(value)}, not a number")
    try:
        number = float(value)
    except OverflowError:
        raise _Bad(f"{where} is too large for a number: {value}") from None
    if not math.isfinite(number):
        raise _Bad(f"{where} is not finite: {value}")
    return number


def _integer(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Bad(f"{where} is {_type(value)}, not an integer")
    return value


def _text(value, where: str) -> str:
    if not isinstance(value, str):
        raise _Bad(f"{where} is {_type(value)}, not a string")
    return value


class SimulatedSensor:
    """Reads ``<sim_dir>/<port>.json``; see the module docstring.  The daemon
    passes ``[sensors] sim_dir`` (default ``<run_dir>/sim``, where the labs
    write: ``Lab.sim_path``)."""

    def __init__(self, sim_dir: str | os.PathLike[str]):
        self.sim_dir = Path(sim_dir)
        self._warned: dict[str, str] = {}

    @classmethod
    def for_run_dir(cls, run_dir: str | os.PathLike[str]) -> "SimulatedSensor":
        return cls(Path(run_dir) / "sim")

    def path(self, port: str) -> Path:
        return self.sim_dir / f"{port}.json"

    def read(self, port: str) -> dict[str, Any] | Unreadable:
        """One file, read whole and checked for schema and port."""
        if not port or "/" in port or port.startswith(".") or "\0" in port:
            return Unreadable(f"{port!r} is not an interface name")
        path = self.path(port)
        try:
            with open(path, "rb") as f:  # one open: one inode, one whole reading
                data = f.read(MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            return Unreadable(f"{port}: no simulated sensor file {path}")
        except OSError as e:
            return Unreadable(f"{port}: cannot read simulated sensor file {path}: {e}")
        if len(data) > MAX_FILE_BYTES:
            return Unreadable(f"{port}: simulated sensor file {path} exceeds {MAX_FILE_BYTES} bytes")
        return parse_document(data, port)

    def _note(self, port: str, reason: str | None) -> None:
        if reason is None:
            self._warned.pop(port, None)
        elif self._warned.get(port) != reason:
            self._warned[port] = reason
            log.warning("sensor_read_failed", port=port, request="simulated counters",
                        reason=reason, effect="fields left empty")

    async def counters(self, port: str) -> CounterSample:
        doc = self.read(port)
        sample = doc if isinstance(doc, Unreadable) else counters_from_document(port, doc)
        if isinstance(sample, Unreadable):
            self._note(port, sample.reason)
            return CounterSample(port=port)
        self._note(port, None)
        return sample

    async def optics(self, port: str) -> OpticsReading | Unreadable:
        doc = self.read(port)
        return doc if isinstance(doc, Unreadable) else optics_from_document(port, doc)

    def close(self) -> None:
        """Nothing is held open between reads."""
