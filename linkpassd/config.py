"""linkpassd configuration: a TOML file in, a validated frozen `Config` out.

Every option is declared once, in `SCHEMA`, with its type, default, help text and
checks. The same table drives validation and the reference documentation
(`docs/config.md`), so the two cannot disagree.

A bad config must never reach the kernel: the daemon refuses to start on one and
keeps the last good config when a SIGHUP reload brings one. Errors are therefore
precise and always ONE line, `<file>: <key path>: <reason>`, because they end up
in journald, in `linkpassd --check-config` output and in "reload rejected" events.

Regenerate the docs after changing `SCHEMA`:

    .venv/bin/python -m linkpassd.config --reference > docs/config.md
"""

from __future__ import annotations

import datetime as dt
import difflib
import ipaddress
import json
import math
import os
import re
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from pathlib import PurePosixPath

from linkpassd.core.model import (BfdSettings, Config, HealthPolicy, MultipathConfig, Ownership,
                                  ProbeSettings, RailConfig, SensorConfig, Timers)

__all__ = [
    "DEFAULT_PATH",
    "SCHEMA",
    "ConfigError",
    "Option",
    "Section",
    "build_config",
    "check_config_main",
    "load_config",
    "parse_config",
    "render_reference_markdown",
]

DEFAULT_PATH = "/etc/linkpass/linkpassd.toml"

# A config is a few kilobytes; refusing anything huge keeps `--check-config /dev/zero`
# from eating memory.
MAX_FILE_BYTES = 1 << 20

U32_MAX = 2**32 - 1
# iproute2 refuses resilient-group timers >= UINT32_MAX / 100 seconds: the kernel
# takes them as a u32 in clock_t (1/100 s).
NH_TIMER_MAX_S = U32_MAX // 100 - 1
# sockaddr_un.sun_path is 108 bytes including the terminating NUL.
SUN_PATH_MAX = 107
IFNAMSIZ = 16

# rtm_protocol values the kernel defines (include/uapi/linux/rtnetlink.h). linkpassd
# adopts and deletes whatever carries its protocol number, so sharing one with the
# kernel or another routing daemon would make it delete that software's routes.
RESERVED_PROTOCOLS = {
    0: "unspec",
    1: "redirect",
    2: "kernel",
    3: "boot",
    4: "static",
    8: "gated",
    9: "ra",
    10: "mrt",
    11: "zebra",
    12: "bird",
    13: "dnrouted",
    14: "xorp",
    15: "ntk",
    16: "dhcp",
    17: "mrouted",
    18: "keepalived",
    42: "babel",
    99: "openr",
    186: "bgp",
    187: "isis",
    188: "ospf",
    189: "rip",
    192: "eigrp",
}
# Tables and rule priorities the system itself depends on; owning one would let
# linkpassd flush the host's main routing.
RESERVED_TABLES = {253: "default", 254: "main", 255: "local"}
RESERVED_RULE_PRIORITIES = {32766: "the main-table rule", 32767: "the default-table rule"}


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------


class ConfigError(Exception):
    """A config that must not be used, located by file and TOML key path."""

    def __init__(self, source: str, key: str | None, reason: str) -> None:
        self.source = source
        self.key = key  # e.g. "rail[1].gateway"; a line/column for syntax errors; None for the file
        self.reason = reason
        super().__init__(source, key, reason)

    def __str__(self) -> str:
        parts = [self.source] if self.key is None else [self.source, self.key]
        return _one_line(": ".join([*parts, self.reason]))


def _one_line(text: str) -> str:
    """Escape anything that could split a message or upset a terminal (newlines,
    U+2028, lone surrogates from undecodable file names)."""
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode("ascii")
        for c in text
    )


class _Invalid(Exception):
    """A reason without a location; the walker adds file and key path. `at` extends
    the path into an array ("[2]")."""

    def __init__(self, reason: str, at: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.at = at


def _show(value: Any) -> str:
    """A value as the operator wrote it, short enough for one line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and value.bit_length() > 128:
        return "a very large integer"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _toml_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, dt.datetime):
        return "date-time"
    if isinstance(value, dt.date):
        return "date"
    if isinstance(value, dt.time):
        return "time"
    return type(value).__name__


def _got(value: Any) -> str:
    if isinstance(value, (list, dict)):
        return f"got {'an array' if isinstance(value, list) else 'a table'}"
    return f"got {_toml_type(value)} {_show(value)}"


# --------------------------------------------------------------------------
# Types and checks: small objects that validate and describe themselves
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Type:
    name: str  # as shown in the reference
    convert: Callable[[Any], Any]  # returns the Python value or raises _Invalid


def _to_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):  # bool is an int subclass
        raise _Invalid(f"expected an integer, {_got(value)}")
    return value


def _to_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Invalid(f"expected a number, {_got(value)}")
    try:
        number = float(value)
    except OverflowError:
        raise _Invalid(f"{_show(value)} is out of range") from None
    if not math.isfinite(number):  # TOML allows nan and inf
        raise _Invalid(f"expected a finite number, got {_show(value)}")
    return number


def _to_bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Invalid(f"expected true or false, {_got(value)}")
    return value


def _to_str(value: Any) -> str:
    if not isinstance(value, str):
        raise _Invalid(f"expected a string, {_got(value)}")
    return value


def _to_str_tuple(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise _Invalid(f"expected an array of strings, {_got(value)}")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise _Invalid(f"expected a string, {_got(item)}", f"[{index}]")
    return tuple(value)


INT = _Type("integer", _to_int)
FLOAT = _Type("number", _to_float)
BOOL = _Type("boolean", _to_bool)
STR = _Type("string", _to_str)
STR_LIST = _Type("array of strings", _to_str_tuple)


@dataclass(frozen=True)
class _Check:
    doc: str  # the constraint as shown in the reference
    run: Callable[[Any], None]  # raises _Invalid

    def __call__(self, value: Any) -> None:
        self.run(value)


def _int_range(lo: int, hi: int) -> _Check:
    def run(value: int) -> None:
        if not lo <= value <= hi:
            raise _Invalid(f"{_show(value)} is outside {lo}..{hi}")

    return _Check(f"{lo}..{hi}", run)


def _at_least(lo: float) -> _Check:
    def run(value: float) -> None:
        if value < lo:
            raise _Invalid(f"{_show(value)} is less than {lo}")

    return _Check(f"≥ {lo}", run)


def _greater_than(lo: float) -> _Check:
    def run(value: float) -> None:
        if value <= lo:
            raise _Invalid(f"{_show(value)} must be greater than {lo}")

    return _Check(f"> {lo}", run)


def _between(lo: float, hi: float) -> _Check:
    def run(value: float) -> None:
        if not lo <= value <= hi:
            raise _Invalid(f"{_show(value)} is outside {lo:g}..{hi:g}")

    return _Check(f"{lo:g}..{hi:g}", run)


def _one_of(*choices: str) -> _Check:
    def run(value: str) -> None:
        if value not in choices:
            raise _Invalid(f"{_show(value)} is not one of {', '.join(choices)}")

    return _Check("one of " + ", ".join(f"`{c}`" for c in choices), run)


def _each(check: _Check) -> _Check:
    """Apply a check to every element of an array, naming the element on error."""

    def run(values: Sequence[Any]) -> None:
        for index, value in enumerate(values):
            try:
                check(value)
            except _Invalid as exc:
                raise _Invalid(exc.reason, f"[{index}]" + exc.at) from None

    return _Check(f"each: {check.doc}", run)


def _non_empty_list(value: Sequence[Any]) -> None:
    if not value:
        raise _Invalid("must not be empty")


def _unique_list(values: Sequence[Any]) -> None:
    first: dict[Any, int] = {}
    for index, value in enumerate(values):
        if value in first:
            raise _Invalid(f"{_show(value)} is listed twice (also at [{first[value]}])", f"[{index}]")
        first[value] = index


NON_EMPTY = _Check("not empty", _non_empty_list)
UNIQUE = _Check("no repeats", _unique_list)

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def _name(value: str) -> None:
    # Names land in key=value logs, metric labels and CLI arguments: keep them plain.
    if not _NAME_RE.fullmatch(value):
        raise _Invalid(
            f"{_show(value)} is not a valid name "
            "(1-64 letters, digits, '_', '.', '-', starting with a letter or digit)"
        )


NAME = _Check("1–64 of `A-Z a-z 0-9 _ . -`", _name)


def _ifname(value: str) -> None:
    # The kernel's dev_valid_name(): what `ip link` would accept.
    if not value:
        raise _Invalid("interface name must not be empty")
    if len(value.encode("utf-8", "surrogatepass")) >= IFNAMSIZ:
        raise _Invalid(f"{_show(value)} is longer than {IFNAMSIZ - 1} bytes, the kernel's limit")
    if value in (".", ".."):
        raise _Invalid(f"{_show(value)} is not a valid interface name")
    for char in value:
        if char in "/:" or char.isspace() or not char.isprintable():
            raise _Invalid(f"{_show(value)} is not a valid interface name (contains {char!r})")


IFNAME = _Check(f"Linux interface name (≤ {IFNAMSIZ - 1} bytes, no `/`, `:` or spaces)", _ifname)


def _abs_path(max_bytes: int | None = None) -> _Check:
    def run(value: str) -> None:
        if not value.startswith("/"):
            raise _Invalid(f"{_show(value)} is not an absolute path")
        if "\0" in value:
            raise _Invalid("path contains a NUL character")
        if max_bytes is not None and len(value.encode("utf-8", "surrogatepass")) > max_bytes:
            raise _Invalid(f"{_show(value)} is longer than {max_bytes} bytes, the limit for a Unix socket path")

    return _Check("absolute path" + (f", ≤ {max_bytes} bytes" if max_bytes else ""), run)


def _route_protocol(value: int) -> None:
    if value in RESERVED_PROTOCOLS:
        raise _Invalid(
            f"{value} is reserved for {RESERVED_PROTOCOLS[value]}; linkpassd deletes what carries "
            "its protocol number, so pick one no other software uses"
        )
    if not 5 <= value <= 255:  # rtm_protocol is a u8; 0..4 belong to the kernel
        raise _Invalid(f"{_show(value)} is outside 5..255")


ROUTE_PROTOCOL = _Check(
    "5..255, except those the kernel registers for routing software ("
    + ", ".join(str(p) for p in RESERVED_PROTOCOLS if p >= 5) + ")",
    _route_protocol,
)


# --- IPv4 ------------------------------------------------------------------

_PREFIXLEN_RE = re.compile(r"[0-9]|[12][0-9]|3[0-2]")


def _ipv4(text: str, whole: str, what: str) -> ipaddress.IPv4Address:
    """Parse the address part of `whole`; IPv6 gets its own message because it is
    a missing feature, not a typo."""
    try:
        return ipaddress.IPv4Address(text)
    except ValueError:
        pass
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        raise _Invalid(f"{_show(whole)} is not an IPv4 {what}") from None
    raise _Invalid(f"{_show(whole)} is IPv6; IPv6 is not supported yet")


def _prefixlen(text: str, whole: str) -> int:
    if not _PREFIXLEN_RE.fullmatch(text):
        raise _Invalid(f"{_show(whole)} has an invalid prefix length {_show(text)} (expected 0..32)")
    return int(text)


def _usable_host(ip: ipaddress.IPv4Address, whole: str, role: str) -> None:
    for test, kind in (
        (ip.is_unspecified, "the unspecified address"),
        (ip.is_loopback, "a loopback address"),
        (ip.is_multicast, "a multicast address"),
        (ip.is_reserved, "a reserved address"),  # 240/4, including 255.255.255.255
    ):
        if test:
            raise _Invalid(f"{_show(whole)} is {kind}, not usable as a {role}")


def _parse_interface(text: str) -> ipaddress.IPv4Interface:
    """`198.18.0.1/24` -> interface; raises _Invalid with the operator's text."""
    addr_text, slash, plen_text = text.partition("/")
    if not slash:
        _ipv4(addr_text, text, "address")  # IPv6 and typos get the better message first
        raise _Invalid(f"{_show(text)} needs the subnet prefix length, e.g. '{text}/24'")
    ip = _ipv4(addr_text, text, "address")
    plen = _prefixlen(plen_text, text)
    if plen == 0:
        raise _Invalid(f"{_show(text)}: prefix length 0 is not a subnet")
    if plen == 32:
        raise _Invalid(f"{_show(text)}: a /32 leaves no room for the gateway; use the rail subnet's prefix length")
    _usable_host(ip, text, "rail address")
    iface = ipaddress.IPv4Interface((ip, plen))
    if plen <= 30 and ip == iface.network.network_address:
        raise _Invalid(f"{_show(text)} is the subnet's network address, not a host address")
    if plen <= 30 and ip == iface.network.broadcast_address:
        raise _Invalid(f"{_show(text)} is the subnet's broadcast address, not a host address")
    return iface


def _check_interface(value: str) -> None:
    _parse_interface(value)


def _check_address(value: str) -> None:
    if "/" in value:
        raise _Invalid(f"{_show(value)}: write the gateway address without a prefix length")
    _usable_host(_ipv4(value, value, "address"), value, "gateway")


def _check_cidr(value: str) -> None:
    addr_text, slash, plen_text = value.partition("/")
    ip = _ipv4(addr_text, value, "CIDR")
    if not slash:
        raise _Invalid(f"{_show(value)} needs a prefix length, e.g. '{value}/32'")
    net = ipaddress.IPv4Network((ip, _prefixlen(plen_text, value)), strict=False)
    if net.network_address != ip:
        raise _Invalid(f"{_show(value)} has host bits set; the network is '{net}'")


IPV4_INTERFACE = _Check("IPv4 `address/prefixlen` (prefix 1..31)", _check_interface)
IPV4_ADDRESS = _Check("IPv4 address", _check_address)
IPV4_CIDR = _Check("IPv4 CIDR, no host bits", _check_cidr)


# --------------------------------------------------------------------------
# The schema: every option, once
# --------------------------------------------------------------------------


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Option:
    key: str
    type: _Type
    default: Any  # REQUIRED, None (computed later, see default_doc), or the value
    help: str
    checks: tuple[_Check, ...] = ()
    default_doc: str | None = None  # how the reference shows a computed default

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


@dataclass(frozen=True)
class Section:
    name: str
    array: bool  # [[name]] (array of tables) rather than [name]
    help: str
    options: tuple[Option, ...]
    rules: tuple[str, ...] = ()  # checks across options, for the reference

    def option(self, key: str) -> Option | None:
        return next((o for o in self.options if o.key == key), None)

    @property
    def header(self) -> str:
        return f"[[{self.name}]]" if self.array else f"[{self.name}]"


_U32 = _int_range(1, U32_MAX)

DAEMON = Section(
    "daemon",
    array=False,
    help="The daemon process itself.",
    options=(
        Option("control_socket", STR, "/run/linkpass/linkpassd.sock",
               "Unix socket of the local control API, used by `linkpassctl` (created mode 0660).",
               (_abs_path(SUN_PATH_MAX),)),
        Option("run_dir", STR, "/run/linkpass",
               "Directory for runtime state, such as the per-NIC `health.json` that launchers read "
               "to exclude bad NICs.",
               (_abs_path(),)),
        Option("log_format", STR, "kv",
               "Log line format: `kv` (key=value) or `json`; one event per line either way.",
               (_one_of("kv", "json"),)),
        Option("log_level", STR, "info", "Lowest level that is logged.",
               (_one_of("debug", "info", "warning", "error"),)),
    ),
)

OWNERSHIP = Section(
    "ownership",
    array=False,
    help="The kernel objects linkpassd owns. It creates, changes and deletes only routes, rules "
         "and nexthops tagged with `route_protocol` and inside these ranges, and leaves "
         "everything else alone, so keep them apart from other routing software on the host. "
         "Rule priorities and nexthop ids are allocated from their ranges by linkpassd.",
    options=(
        Option("route_protocol", INT, 201,
               "`rtm_protocol` tag on every route, rule and nexthop linkpassd installs. On start it "
               "adopts, and may delete, everything carrying this tag, so no other software may "
               "use it; the kernel's own values and those registered for routing daemons are "
               "refused.",
               (ROUTE_PROTOCOL,)),
        Option("table_min", INT, 10100, "First routing table id linkpassd may use.", (_U32,)),
        Option("table_max", INT, 10199,
               "Last routing table id linkpassd may use. The range needs one table per rail and "
               "one per multipath group.",
               (_U32,)),
        Option("rule_priority_min", INT, 10100, "First policy rule priority linkpassd may use.", (_U32,)),
        Option("rule_priority_max", INT, 10199,
               "Last policy rule priority linkpassd may use. The range needs one rule per rail "
               "(two with `routing.roce_rules`) and one per multipath group.",
               (_U32,)),
        Option("nexthop_id_min", INT, 1_000_100, "First nexthop object id linkpassd may use.", (_U32,)),
        Option("nexthop_id_max", INT, 1_000_199,
               "Last nexthop object id linkpassd may use. The range needs one id per rail and one "
               "per multipath group.",
               (_U32,)),
    ),
    rules=(
        "each `*_min` ≤ its `*_max`",
        "the table range must not include 253 (default), 254 (main) or 255 (local)",
        "the rule priority range must not include 32766 or 32767 (the main and default rules)",
        "each range must hold what the configured rails and multipath groups need",
    ),
)

TIMERS = Section(
    "timers",
    array=False,
    help="How fast a port is declared down and how cautiously it is trusted again. A false "
         "failover costs as much as a missed one, so recovery is deliberately slower than failure.",
    options=(
        Option("rise", INT, 3, "Consecutive good samples before a recovered port is trusted.",
               (_at_least(1),)),
        Option("fall", INT, 1, "Consecutive bad samples before a port is declared down.",
               (_at_least(1),)),
        Option("hold_down_s", FLOAT, 5.0,
               "Seconds a recovered port must stay healthy before traffic fails back to it.",
               (_at_least(0),)),
        Option("tick_interval_s", FLOAT, 0.5,
               "Seconds between health samples taken from cached link state.",
               (_greater_than(0),)),
        Option("resync_interval_s", FLOAT, 30.0,
               "Seconds between full re-reads of kernel state, even when no event arrived.",
               (_greater_than(0),)),
    ),
    rules=("`resync_interval_s` ≥ `tick_interval_s`",),
)

HEALTH = Section(
    "health",
    array=False,
    help="How counters, optics and flaps turn into a verdict. A signal degrades a port only "
         "after `confirm` consecutive readings agree; DEGRADED ports are drained while a healthy "
         "alternative exists. Optic thresholds are the module's own warning levels.",
    options=(
        Option("confirm", INT, 3,
               "Consecutive readings of a signal (optics readings, counter intervals) before it "
               "may degrade a port: one spiky reading drains nothing.", (_at_least(1),)),
        Option("counter_window_s", FLOAT, 10.0,
               "Seconds over which error counter rates are computed.", (_greater_than(0),)),
        Option("crc_errors_per_s", FLOAT, 10.0, "RX CRC (FCS) errors per second that degrade a port.",
               (_greater_than(0),)),
        Option("symbol_errors_per_s", FLOAT, 10.0, "Symbol errors per second that degrade a port.",
               (_greater_than(0),)),
        Option("fec_uncorrectable_per_s", FLOAT, 1.0,
               "Uncorrectable FEC blocks per second that degrade a port (each is lost data).",
               (_greater_than(0),)),
        Option("fec_corrected_per_s", FLOAT, 0.0,
               "Corrected FEC blocks per second that degrade a port (pre-FEC errors); 0 turns this "
               "check off, since healthy high-speed links correct errors all the time.",
               (_at_least(0),)),
        Option("rx_power_margin_db", FLOAT, 0.0,
               "dB added to the module's RX power low warning level before it degrades a port.",
               (_at_least(0),)),
        Option("trend_window_s", FLOAT, 60.0,
               "Seconds of RX power history used to see a decline coming.", (_greater_than(0),)),
        Option("trend_min_samples", INT, 6, "Readings needed before a trend is trusted.",
               (_at_least(3),)),
        Option("trend_min_drop_db", FLOAT, 1.0,
               "RX power must have fallen at least this much over the window to count as a trend.",
               (_greater_than(0),)),
        Option("predict_horizon_s", FLOAT, 120.0,
               "Drain a port whose RX power trend reaches the module's low alarm within this "
               "many seconds.", (_at_least(0),)),
        Option("flap_penalty", FLOAT, 1000.0, "Penalty added per carrier loss (flap dampening).",
               (_greater_than(0),)),
        Option("flap_half_life_s", FLOAT, 15.0, "Seconds for the flap penalty to halve.",
               (_greater_than(0),)),
        Option("flap_suppress", FLOAT, 2500.0,
               "Penalty at which a flapping port is kept DEGRADED beyond its hold-down.",
               (_greater_than(0),)),
        Option("flap_reuse", FLOAT, 800.0,
               "Penalty below which a suppressed port may be used again.", (_greater_than(0),)),
        Option("flap_max_penalty", FLOAT, 10000.0,
               "Cap on the penalty, which bounds how long a port stays suppressed.",
               (_greater_than(0),)),
    ),
    rules=("`flap_reuse` < `flap_suppress` ≤ `flap_max_penalty`",),
)

SENSORS = Section(
    "sensors",
    array=False,
    help="Where counters and optics are read from, and how often. `ethtool` reads the kernel "
         "(ethtool netlink, module EEPROM; a driver without a counter or module is normal); `sim` "
         "reads simulated files (labs; format in labs/faults/simsensor.md).",
    options=(
        Option("backend", STR, "ethtool", "`ethtool` or `sim`.", (_one_of("ethtool", "sim"),)),
        Option("sim_dir", STR, None, "Directory of `<port>.json` files for the `sim` backend.",
               (_abs_path(),), default_doc="`<run_dir>/sim`"),
        Option("counters_interval_s", FLOAT, 1.0, "Seconds between counter reads.",
               (_greater_than(0),)),
        Option("optics_interval_s", FLOAT, 2.0,
               "Seconds between module EEPROM reads (one reader per module at a time).",
               (_greater_than(0),)),
    ),
)

BFD = Section(
    "bfd",
    array=False,
    help="BFD (RFC 5880/5881, single hop) with each rail's gateway where the rail sets "
         "`bfd = true`; interoperates with switch and FRR bfdd sessions. Detection takes "
         "`detect_mult` × the negotiated interval; a session that never came up, a peer that "
         "goes AdminDown, and a Down our own stalled event loop could explain are not path "
         "failures.",
    options=(
        Option("interval_ms", INT, 300,
               "Desired transmit and required receive interval once Up (FRR's default is 300; "
               "before Up, BFD slows to 1 s).", (_int_range(10, 60000),)),
        Option("detect_mult", INT, 3, "Missed packets before the session is declared Down.",
               (_int_range(1, 255),)),
    ),
)

PROBES = Section(
    "probes",
    array=False,
    help="UDP echo probes between linkpassd peers, end to end across the fabric: they see what "
         "carrier and single-hop BFD cannot (a blackholing spine, one-way loss upstream). A "
         "missed probe only raises suspicion and starts a burst of confirmation probes; only a "
         "lost burst takes the path DOWN, so detection costs about one interval plus the burst, "
         "where BFD costs `detect_mult` intervals. Sustained random loss above `max_loss_ratio` "
         "makes the path DEGRADED. A rail is DOWN only when every peer that ever answered "
         "through it is unreachable (a dead peer host fails nothing), DEGRADED when most are "
         "bad. Misses our own stalled event loop could explain, and peers that never answered, "
         "count for nothing. With `enabled`, every daemon also answers its peers' probes, and "
         "each rail gets a probe table (`rail.probe_table`) and two rules that keep probes and "
         "replies on the rail's own path even while its traffic has failed over, so recovery "
         "is seen.",
    options=(
        Option("enabled", BOOL, False,
               "Answer peers' probes, pin probe traffic to each rail's own path, and probe the "
               "rails' `probe_peers`."),
        Option("port", INT, 4793,
               "UDP port of the echo responder, the same on every host (4793 sits next to the "
               "RoCEv2 ports and clear of BFD, VXLAN and the ephemeral range).",
               (_int_range(1, 65535),)),
        Option("interval_ms", FLOAT, 50.0, "Milliseconds between steady probes on each path.",
               (_between(1, 60000),)),
        Option("timeout_ms", FLOAT, 8.0,
               "A reply later than this is a miss and starts the confirmation burst. Round trips "
               "in one fabric are well under a millisecond; our own stalls are accounted for "
               "separately.", (_greater_than(0),)),
        Option("burst_count", INT, 8,
               "Confirmation probes after a miss on a clean path (a path that already loses "
               "probes gets more, up to 32, so its loss cannot fake a DOWN).",
               (_int_range(1, 32),)),
        Option("burst_interval_ms", FLOAT, 1.0, "Milliseconds between confirmation probes.",
               (_between(0, 1000),)),
        Option("rise", INT, 3,
               "On-time replies in a row before a path that was down (or never up) counts as up.",
               (_int_range(1, 1000),)),
        Option("loss_window", INT, 200, "Steady probes the loss ratio is measured over.",
               (_int_range(10, 100000),)),
        Option("max_loss_ratio", FLOAT, 0.20,
               "Share of steady probes lost above which a path is DEGRADED.", (_between(0.001, 1),)),
        Option("clear_loss_ratio", FLOAT, 0.10,
               "Share at or below which a DEGRADED path is healthy again.", (_between(0, 1),)),
        Option("tos", INT, 0,
               "IP TOS byte of probes, e.g. the RoCE traffic class's DSCP << 2 so that probes "
               "share its queue.", (_int_range(0, 255),)),
        Option("lag_heartbeat_ms", FLOAT, 25.0,
               "How often the event loop checks its own scheduling lag, so a stall of ours is "
               "not read as a dead path; 0 relies on the probes' own timers only.",
               (_between(0, 1000),)),
    ),
    rules=(
        "`timeout_ms` < `interval_ms`; `clear_loss_ratio` < `max_loss_ratio`",
        "`rail.probe_peers` requires `enabled = true`",
    ),
)

ROUTING = Section(
    "routing",
    array=False,
    help="Routing behaviour shared by all rails.",
    options=(
        Option("roce_rules", BOOL, True,
               "Also add, per rail, a rule sending RoCEv2 (UDP destination port 4791) from the "
               "rail address to the rail table."),
    ),
)

RAIL = Section(
    "rail",
    array=True,
    help="One NIC port (a \"rail\") with its own source address and routing table: traffic from "
         "the rail address is looked up in the rail table, and when the port fails that table "
         "is pointed at the first healthy backup rail. At least one `[[rail]]` is required.",
    options=(
        Option("name", STR, REQUIRED,
               "Name used in logs, metrics, `backups` and `multipath.rails`; unique.", (NAME,)),
        Option("port", STR, REQUIRED, "Network interface of the rail, e.g. `eth0`; unique.",
               (IFNAME,)),
        Option("address", STR, REQUIRED,
               "Host address on the rail with the subnet's prefix length, e.g. `198.18.0.1/24`; "
               "unique. IPv4 only for now.",
               (IPV4_INTERFACE,)),
        Option("gateway", STR, REQUIRED,
               "Next hop on the rail (the leaf switch); inside the rail subnet.", (IPV4_ADDRESS,)),
        Option("table", INT, None,
               "Routing table of the rail: inside the owned table range and not used twice. Set it "
               "to keep it stable when rails are added or removed.",
               (_U32,),
               default_doc="lowest free table of the owned range, in rail order"),
        Option("backups", STR_LIST, (),
               "Other rails whose paths this rail's table uses when its own port is down, in "
               "order of preference.",
               (UNIQUE,)),
        Option("destinations", STR_LIST, ("0.0.0.0/0",),
               "Destinations routed in the rail table.",
               (NON_EMPTY, _each(IPV4_CIDR), UNIQUE)),
        Option("bfd", BOOL, False,
               "Run a single-hop BFD session with `gateway` (the leaf switch) on this port; a "
               "session that was up and goes down takes the port DOWN (timers in `[bfd]`)."),
        Option("probe_peers", STR_LIST, (),
               "Addresses of peer linkpassd hosts (their address on the same rail) to echo-probe "
               "from this rail's address and port (`[probes]`). Each must lie in one of the "
               "rail's `destinations` and outside the rail subnet.",
               (_each(IPV4_ADDRESS), UNIQUE)),
        Option("probe_table", INT, None,
               "Routing table that keeps the rail's own path for probes and replies, used when "
               "`[probes] enabled`: inside the owned table range and not used twice.",
               (_U32,),
               default_doc="lowest free table after the rails' and groups' tables"),
    ),
    rules=(
        "`name`, `port` and the host part of `address` are unique across rails",
        "`gateway` is inside the subnet of `address` and is not the address itself",
        "`backups` name other configured rails, not the rail itself",
        "`probe_peers` lie in `destinations`, outside the rail subnet, and are no rail's address",
    ),
)

MULTIPATH = Section(
    "multipath",
    array=True,
    help="A destination spread over several rails through a kernel resilient nexthop group "
         "(Linux ≥ 5.13): removing a failed path remaps only that path's flows.",
    options=(
        Option("name", STR, REQUIRED, "Name used in logs and metrics; unique among groups.",
               (NAME,)),
        Option("destination", STR, REQUIRED, "Destination routed through the group; unique.",
               (IPV4_CIDR,)),
        Option("rails", STR_LIST, REQUIRED, "Member rails, in order of preference.",
               (NON_EMPTY, UNIQUE)),
        Option("table", INT, None,
               "Routing table of the group: inside the owned table range and not used twice.",
               (_U32,),
               default_doc="lowest free table after the rails' tables"),
        Option("buckets", INT, 64,
               "Hash buckets of the resilient group; at least the number of rails. The kernel "
               "cannot change it on an existing group.",
               (_int_range(1, 65535),)),
        Option("idle_timer_s", INT, 0,
               "Seconds a bucket must be idle before it may move to rebalance the group; 0 "
               "counts every bucket as idle.",
               (_int_range(0, NH_TIMER_MAX_S),)),
        Option("unbalanced_timer_s", INT, 0,
               "Seconds the group may stay unbalanced before busy buckets are moved anyway; 0 "
               "never forces a move.",
               (_int_range(0, NH_TIMER_MAX_S),)),
        Option("min_paths", INT, 1,
               "Capacity floor: linkpassd never shrinks the group below this many members while "
               "their ports can carry traffic.",
               (_at_least(1),)),
    ),
    rules=(
        "`rails` name configured rails",
        "`min_paths` ≤ number of `rails`; `buckets` ≥ number of `rails`",
    ),
)

SCHEMA: tuple[Section, ...] = (DAEMON, OWNERSHIP, TIMERS, HEALTH, SENSORS, BFD, PROBES, ROUTING,
                               RAIL, MULTIPATH)


# --------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate a config file. Every failure, I/O included, is a ConfigError."""
    source = os.fsdecode(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(source, None, f"cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(source, None, f"larger than {MAX_FILE_BYTES} bytes; not a linkpassd config")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            source, f"line {line}", f"not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None
    return parse_config(text, source)


def parse_config(text: str, source: str = "<memory>") -> Config:
    """Validate TOML text; `source` names it in errors and in Config.source."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        where, reason = _toml_error_location(exc)
        raise ConfigError(source, where, f"invalid TOML: {reason}") from None
    except RecursionError:
        raise ConfigError(source, None, "invalid TOML: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer literal beyond Python's digit limit
        raise ConfigError(source, None, f"invalid TOML: {exc}") from None
    return build_config(doc, source)


_TOML_AT = re.compile(r"^(?P<msg>.*) \(at (?:line (?P<line>\d+), column (?P<col>\d+)|end of document)\)$", re.S)


def _toml_error_location(exc: tomllib.TOMLDecodeError) -> tuple[str, str]:
    # Python 3.14 exposes msg/lineno/colno; 3.11 only has them in the message.
    if getattr(exc, "lineno", None) is not None and getattr(exc, "msg", None):
        return f"line {exc.lineno}, column {exc.colno}", exc.msg
    match = _TOML_AT.match(str(exc))
    if not match:
        return "TOML", str(exc)
    if match["line"]:
        return f"line {match['line']}, column {match['col']}", match["msg"]
    return "end of file", match["msg"]


def build_config(doc: Mapping[str, Any], source: str = "<memory>") -> Config:
    """Validate an already-parsed TOML document (what tomllib returns)."""
    return _Builder(source).build(doc)


# --------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _key(name: str) -> str:
    """A key path segment as TOML would spell it."""
    return name if _BARE_KEY.fullmatch(name) else json.dumps(name)


def _suggest(word: str, candidates: Sequence[str]) -> str:
    match = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean '{match[0]}'?" if match else ""


class _Builder:
    """One validation run; knows the source so every failure can name it."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str | None, reason: str) -> NoReturn:
        raise ConfigError(self.source, key, reason)

    # --- shape -------------------------------------------------------------

    def top_level(self, doc: Mapping[str, Any]) -> None:
        names = [s.name for s in SCHEMA]
        for key in doc:
            if key in names:
                continue
            home = next((s for s in SCHEMA if s.option(key)), None)
            if home is not None:
                self.fail(_key(key), f"key outside any section; it belongs in {home.header}")
            self.fail(_key(key), "unknown section" + _suggest(key, names))

    def table(self, raw: Any, section: Section, path: str) -> dict[str, Any]:
        """Validate one table against its section: unknown keys, required keys, types, checks."""
        if not isinstance(raw, dict):
            self.fail(path, f"expected a table {section.header}, {_got(raw)}")
        known = [o.key for o in section.options]
        for key in raw:
            if key not in known:
                hint = _suggest(key, known)
                if not hint:
                    home = next((s for s in SCHEMA if s is not section and s.option(key)), None)
                    hint = f"; it belongs in {home.header}" if home else ""
                self.fail(f"{path}.{_key(key)}", "unknown key" + hint)
        values: dict[str, Any] = {}
        for opt in section.options:
            where = f"{path}.{opt.key}"
            if opt.key not in raw:
                if opt.required:
                    self.fail(where, "missing required key")
                values[opt.key] = opt.default
                continue
            try:
                value = opt.type.convert(raw[opt.key])
                for check in opt.checks:
                    check(value)
            except _Invalid as exc:
                self.fail(where + exc.at, exc.reason)
            values[opt.key] = value
        return values

    def section(self, doc: Mapping[str, Any], section: Section) -> dict[str, Any]:
        return self.table(doc.get(section.name, {}), section, section.name)

    def entries(self, doc: Mapping[str, Any], section: Section) -> list[Any]:
        raw = doc.get(section.name, [])
        if isinstance(raw, dict):
            self.fail(section.name, f"write {section.header}, not [{section.name}]: it is an array of tables")
        if not isinstance(raw, list):
            self.fail(section.name, f"expected an array of tables {section.header}, {_got(raw)}")
        return raw

    # --- the whole document -----------------------------------------------

    def build(self, doc: Mapping[str, Any]) -> Config:
        self.top_level(doc)
        daemon = self.section(doc, DAEMON)
        own = self.section(doc, OWNERSHIP)
        timers = self.section(doc, TIMERS)
        health = self.section(doc, HEALTH)
        sensors = self.section(doc, SENSORS)
        bfd = self.section(doc, BFD)
        probes = self.section(doc, PROBES)
        routing = self.section(doc, ROUTING)
        self.check_ownership(own)
        self.check_timers(timers)
        self.check_health(health)
        self.check_probes(probes)
        rails = self.rails(self.entries(doc, RAIL))
        self.check_probe_peers(rails, probes["enabled"])
        groups = self.groups(self.entries(doc, MULTIPATH), rails)
        self.check_capacity(own, len(rails), len(groups), routing["roce_rules"],
                            probes["enabled"])
        rail_tables, group_tables, probe_tables = self.allocate_tables(
            own, rails, groups, probes["enabled"])

        return Config(
            rails=tuple(
                RailConfig(
                    name=r["name"],
                    port=r["port"],
                    address=str(r["_iface"].ip),
                    prefixlen=r["_iface"].network.prefixlen,
                    gateway=r["gateway"],
                    table=table,
                    backups=r["backups"],
                    destinations=r["destinations"],
                    bfd=r["bfd"],
                    probe_peers=r["probe_peers"],
                    probe_table=probe_table,
                )
                for r, table, probe_table in zip(rails, rail_tables, probe_tables)
            ),
            multipath=tuple(
                MultipathConfig(
                    name=g["name"],
                    destination=g["destination"],
                    rails=g["rails"],
                    table=table,
                    buckets=g["buckets"],
                    idle_timer_s=g["idle_timer_s"],
                    unbalanced_timer_s=g["unbalanced_timer_s"],
                    min_paths=g["min_paths"],
                )
                for g, table in zip(groups, group_tables)
            ),
            ownership=Ownership(**own),
            timers=Timers(**timers),
            health=HealthPolicy(**{**health, "fec_corrected_per_s":
                                   health["fec_corrected_per_s"] or None}),
            sensors=SensorConfig(**{**sensors, "sim_dir": sensors["sim_dir"]
                                    or str(PurePosixPath(daemon["run_dir"]) / "sim")}),
            bfd=BfdSettings(**bfd),
            probes=ProbeSettings(**probes),
            roce_rules=routing["roce_rules"],
            control_socket=daemon["control_socket"],
            run_dir=daemon["run_dir"],
            log_format=daemon["log_format"],
            log_level=daemon["log_level"],
            source=self.source,
        )

    def check_health(self, health: dict[str, Any]) -> None:
        if not health["flap_reuse"] < health["flap_suppress"]:
            self.fail("health.flap_reuse", f"{health['flap_reuse']:g} must be below flap_suppress "
                      f"({health['flap_suppress']:g}), or a suppressed port is never reused")
        if health["flap_suppress"] > health["flap_max_penalty"]:
            self.fail("health.flap_suppress", f"{health['flap_suppress']:g} is above "
                      f"flap_max_penalty ({health['flap_max_penalty']:g}): it could never be reached")

    def check_probes(self, probes: dict[str, Any]) -> None:
        if not probes["timeout_ms"] < probes["interval_ms"]:
            self.fail("probes.timeout_ms", f"{probes['timeout_ms']:g} must be below interval_ms "
                      f"({probes['interval_ms']:g}): a probe must be judged before the next leaves")
        if not probes["clear_loss_ratio"] < probes["max_loss_ratio"]:
            self.fail("probes.clear_loss_ratio", f"{probes['clear_loss_ratio']:g} must be below "
                      f"max_loss_ratio ({probes['max_loss_ratio']:g}), or a degraded path "
                      "oscillates")

    def check_probe_peers(self, rails: list[dict[str, Any]], enabled: bool) -> None:
        addresses = {r["_iface"].ip: r["name"] for r in rails}
        for i, rail in enumerate(rails):
            if not enabled:
                for key in ("probe_peers", "probe_table"):
                    if rail[key]:
                        self.fail(f"rail[{i}].{key}",
                                  "set, but [probes] enabled is false; enable probing or remove it")
                continue
            destinations = [ipaddress.IPv4Network(d) for d in rail["destinations"]]
            for j, text in enumerate(rail["probe_peers"]):
                where, peer = f"rail[{i}].probe_peers[{j}]", ipaddress.IPv4Address(text)
                if peer in addresses:
                    self.fail(where, f"{_show(text)} is the address of rail "
                              f"{_show(addresses[peer])} on this host")
                if peer in rail["_iface"].network:
                    self.fail(where, f"{_show(text)} is inside the rail subnet "
                              f"{rail['_iface'].network}: on-link peers are reached without "
                              "the gateway, which probe tables do not cover yet; list hosts "
                              "across the fabric (and use bfd for the gateway)")
                if not any(peer in d for d in destinations):
                    self.fail(where, f"{_show(text)} is not inside the rail's destinations "
                              f"({', '.join(rail['destinations'])}), so no rail route reaches it")

    def check_ownership(self, own: dict[str, Any]) -> None:
        for kind in ("table", "rule_priority", "nexthop_id"):
            lo, hi = own[f"{kind}_min"], own[f"{kind}_max"]
            if lo > hi:
                self.fail(f"ownership.{kind}_min", f"{lo} is greater than {kind}_max ({hi})")
        for reserved, kind in ((RESERVED_TABLES, "table"), (RESERVED_RULE_PRIORITIES, "rule_priority")):
            lo, hi = own[f"{kind}_min"], own[f"{kind}_max"]
            for value, what in reserved.items():
                if lo <= value <= hi:
                    self.fail(
                        f"ownership.{kind}_min",
                        f"range {lo}..{hi} includes {value} ({what}), which linkpassd must never own",
                    )

    def check_timers(self, timers: dict[str, Any]) -> None:
        if timers["resync_interval_s"] < timers["tick_interval_s"]:
            self.fail(
                "timers.resync_interval_s",
                f"{timers['resync_interval_s']} is shorter than tick_interval_s ({timers['tick_interval_s']})",
            )

    def rails(self, raw: list[Any]) -> list[dict[str, Any]]:
        if not raw:
            self.fail("rail", "no rails configured; at least one [[rail]] is required")
        rails: list[dict[str, Any]] = []
        seen: dict[tuple[str, Any], int] = {}
        for i, entry in enumerate(raw):
            path = f"rail[{i}]"
            rail = self.table(entry, RAIL, path)
            iface = _parse_interface(rail["address"])  # already checked; cannot fail
            rail["_iface"] = iface
            gateway = ipaddress.IPv4Address(rail["gateway"])
            if gateway == iface.ip:
                self.fail(f"{path}.gateway", f"{_show(rail['gateway'])} is the rail's own address")
            if gateway not in iface.network:
                self.fail(
                    f"{path}.gateway",
                    f"{_show(rail['gateway'])} is not inside the rail subnet {iface.network}",
                )
            net = iface.network
            if net.prefixlen <= 30 and gateway in (net.network_address, net.broadcast_address):
                which = "network" if gateway == net.network_address else "broadcast"
                self.fail(f"{path}.gateway", f"{_show(rail['gateway'])} is the subnet's {which} address")
            for key, value in (("name", rail["name"]), ("port", rail["port"]), ("address", iface.ip)):
                if (key, value) in seen:
                    self.fail(f"{path}.{key}", f"{_show(str(value))} is already used by rail[{seen[key, value]}]")
                seen[key, value] = i
            rails.append(rail)

        names = [r["name"] for r in rails]
        for i, rail in enumerate(rails):
            for j, backup in enumerate(rail["backups"]):
                where = f"rail[{i}].backups[{j}]"
                if backup == rail["name"]:
                    self.fail(where, f"{_show(backup)} is this rail; a rail cannot back up itself")
                if backup not in names:
                    self.fail(where, self._unknown_rail(backup, names))
        return rails

    @staticmethod
    def _unknown_rail(name: str, names: list[str]) -> str:
        hint = _suggest(name, names)
        return f"unknown rail {_show(name)}" + (hint or f"; rails are {', '.join(names)}")

    def groups(self, raw: list[Any], rails: list[dict[str, Any]]) -> list[dict[str, Any]]:
        names = [r["name"] for r in rails]
        groups: list[dict[str, Any]] = []
        seen: dict[tuple[str, str], int] = {}
        for i, entry in enumerate(raw):
            path = f"multipath[{i}]"
            group = self.table(entry, MULTIPATH, path)
            for key in ("name", "destination"):
                if (key, group[key]) in seen:
                    self.fail(
                        f"{path}.{key}",
                        f"{_show(group[key])} is already used by multipath[{seen[key, group[key]]}]",
                    )
                seen[key, group[key]] = i
            for j, member in enumerate(group["rails"]):
                if member not in names:
                    self.fail(f"{path}.rails[{j}]", self._unknown_rail(member, names))
            count = len(group["rails"])
            if group["min_paths"] > count:
                self.fail(
                    f"{path}.min_paths",
                    f"{group['min_paths']} is more than the group's {count} rail{'s' * (count != 1)}",
                )
            if group["buckets"] < count:
                self.fail(
                    f"{path}.buckets",
                    f"{group['buckets']} bucket{'s' * (group['buckets'] != 1)} cannot spread traffic "
                    f"over {count} rails; use at least {count}",
                )
            groups.append(group)
        return groups

    def check_capacity(self, own: dict[str, Any], n_rails: int, n_groups: int, roce_rules: bool,
                       probes: bool = False) -> None:
        rules_per_rail = 1 + roce_rules + 2 * probes
        tables_per_rail = 1 + probes
        features = [name for name, on in (("roce_rules", roce_rules), ("probes", probes)) if on]
        rule_why = f"{rules_per_rail} per rail" + (f" with {' and '.join(features)}"
                                                    if features else "")
        needs = (
            ("table", "tables", n_rails * tables_per_rail + n_groups,
             ("2 per rail with probes" if probes else "1 per rail") + ", 1 per multipath group"),
            ("rule_priority", "rule priorities", n_rails * rules_per_rail + n_groups,
             rule_why + ", 1 per multipath group"),
            ("nexthop_id", "nexthop ids", n_rails + n_groups, "1 per rail, 1 per multipath group"),
        )
        for kind, plural, need, why in needs:
            lo, hi = own[f"{kind}_min"], own[f"{kind}_max"]
            if hi - lo + 1 < need:
                self.fail(
                    f"ownership.{kind}_max",
                    f"range {lo}..{hi} has room for {hi - lo + 1}, but {_count(n_rails, 'rail')} and "
                    f"{_count(n_groups, 'multipath group')} need {need} {plural}: {why}",
                )

    def allocate_tables(
        self, own: dict[str, Any], rails: list[dict[str, Any]], groups: list[dict[str, Any]],
        probes: bool = False,
    ) -> tuple[list[int], list[int], list[int | None]]:
        """Explicit tables first; then the lowest free ones: rails in order, then
        groups, then (with probes) the rails' probe tables. check_capacity
        guarantees enough free tables."""
        lo, hi = own["table_min"], own["table_max"]
        wanted = [(f"rail[{i}].table", r, "table") for i, r in enumerate(rails)]
        wanted += [(f"multipath[{i}].table", g, "table") for i, g in enumerate(groups)]
        if probes:
            wanted += [(f"rail[{i}].probe_table", r, "probe_table") for i, r in enumerate(rails)]
        used: dict[int, str] = {}
        for path, entry, key in wanted:
            table = entry[key]
            if table is None:
                continue
            if not lo <= table <= hi:
                self.fail(path, f"{table} is outside the owned table range {lo}..{hi}")
            if table in used:
                self.fail(path, f"table {table} is already used by {used[table]}")
            used[table] = path.removesuffix(".table")

        cursor = lo
        allocated: list[int] = []
        for _path, entry, key in wanted:
            if entry[key] is not None:
                allocated.append(entry[key])
                continue
            while cursor in used:
                cursor += 1
            used[cursor] = "allocation"
            allocated.append(cursor)
        n, m = len(rails), len(groups)
        probe_tables = allocated[n + m:] if probes else [None] * n
        return allocated[:n], allocated[n:n + m], probe_tables


# --------------------------------------------------------------------------
# Reference documentation
# --------------------------------------------------------------------------


def _toml_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(_toml_literal(v) for v in value) + "]"
    return repr(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_reference_markdown() -> str:
    """The config reference, generated from SCHEMA (committed as docs/config.md)."""
    out = [
        "# linkpassd configuration reference",
        "",
        "<!-- Generated from SCHEMA in linkpassd/config.py; do not edit by hand. Regenerate with",
        "     .venv/bin/python -m linkpassd.config --reference > docs/config.md -->",
        "",
        f"linkpassd reads one TOML file, by default `{DEFAULT_PATH}`. Every section is optional "
        "except at least one `[[rail]]`; options left out take the default shown. Unknown "
        "sections and keys, wrong types and impossible values are errors: linkpassd refuses to "
        "start on a bad file, and a SIGHUP reload of one keeps the running config.",
        "",
        "Check a file without touching the system: `linkpassd --check-config FILE`. Errors are "
        "one line, `<file>: <key path>: <reason>`, with key paths such as "
        "`ownership.table_min`, `rail[1].gateway` or `rail[0].backups[1]` (arrays count from 0).",
        "",
        "IPv4 only for now. A complete example is `examples/linkpassd.toml`.",
    ]
    for section in SCHEMA:
        out += ["", f"## `{section.header}`", "", section.help, ""]
        out += ["| key | type | default | allowed | description |", "|---|---|---|---|---|"]
        for opt in section.options:
            if opt.required:
                default = "**required**"
            elif opt.default_doc:
                default = opt.default_doc
            else:
                default = f"`{_toml_literal(opt.default)}`"
            allowed = "; ".join(c.doc for c in opt.checks) or "—"
            out.append(
                f"| `{opt.key}` | {opt.type.name} | {_cell(default)} | {_cell(allowed)} | {_cell(opt.help)} |"
            )
        if section.rules:
            out += ["", "Also checked:", ""]
            out += [f"- {rule}" for rule in section.rules]
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------
# linkpassd --check-config
# --------------------------------------------------------------------------


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def check_config_main(path: str | os.PathLike[str]) -> int:
    """`linkpassd --check-config FILE`: 0 and an OK line, or 1 and the one-line error
    on stderr. Never a traceback: it runs in ExecStartPre and in config pipelines."""
    try:
        config = load_config(path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(
        f"OK: {_one_line(config.source)}: {_count(len(config.rails), 'rail')}, "
        f"{_count(len(config.multipath), 'multipath group')}"
    )
    return 0


def _main(argv: Sequence[str]) -> int:
    if list(argv) == ["--reference"]:
        sys.stdout.write(render_reference_markdown())
        return 0
    if len(argv) == 1 and not argv[0].startswith("-"):
        return check_config_main(argv[0])
    print("usage: python -m linkpassd.config (--reference | FILE)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
