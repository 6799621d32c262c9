"""Config building blocks: the error type, value types and the checks that
validate and describe themselves (each check's `doc` goes into docs/config.md).

Errors are always ONE line, `<file>: <key path>: <reason>`, because they end up
in journald, in `linkpassd --check-config` output and in "reload rejected" events.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

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


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


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


def _to_str_or_str_tuple(value: Any) -> str | tuple[str, ...]:
    """One string as it is, or an array of strings as a tuple: the caller
    (config.build) makes both a tuple, after the checks have named the bad
    element by its index only when there is an array."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return _to_str_tuple(value)
    raise _Invalid(f"expected a string or an array of strings, {_got(value)}")


INT = _Type("integer", _to_int)
FLOAT = _Type("number", _to_float)
BOOL = _Type("boolean", _to_bool)
STR = _Type("string", _to_str)
STR_LIST = _Type("array of strings", _to_str_tuple)
STR_OR_LIST = _Type("string or array of strings", _to_str_or_str_tuple)


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


def _one_or_list(check: _Check, noun: str) -> _Check:
    """For STR_OR_LIST: one string that passes `check`, or a non-empty array
    of distinct strings that each pass it (an error names the element by its
    index; a lone string's error has no index, as before arrays were allowed)."""
    def run(value: str | Sequence[str]) -> None:
        if isinstance(value, str):
            check(value)
            return
        if not value:
            raise _Invalid(f"an empty array; list at least one {noun}")
        _each(check)(value)
        _unique_list(value)

    return _Check(f"{check.doc}; or a non-empty array of them, no repeats", run)


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


def _listen_address() -> _Check:
    """"" (off) or IP:PORT, an IPv6 address in brackets ([::1]:9469)."""
    def run(value: str) -> None:
        if value == "":
            return
        host, sep, port = value.rpartition(":")
        if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise _Invalid(f"{_show(value)} is not IP:PORT (e.g. 127.0.0.1:9469) with a port "
                           "in 1..65535")
        bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        try:
            ipaddress.ip_address(bare)
        except ValueError:
            raise _Invalid(f"{_show(host)} is not an IP address (a name is not resolved here)") \
                from None

    return _Check("empty (off) or IP:PORT", run)


_HOST_NAME_RE = re.compile(r"(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,62}))*\.?")


def _host_port() -> _Check:
    """HOST:PORT where HOST is a DNS name, an IPv4 address or [IPv6] (resolved
    when the agent connects, never here), or unix:/abs/path (an aggregator on
    this machine; the labs' daemons reach theirs so across namespaces)."""
    def run(value: str) -> None:
        if value.startswith("unix:"):
            path = value[len("unix:"):]
            if not path.startswith("/") or len(path.encode()) > 107:
                raise _Invalid(f"{_show(value)}: a Unix socket needs an absolute path of at most "
                               "107 bytes (unix:/run/...)")
            return
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise _Invalid(f"{_show(value)} is not HOST:PORT (e.g. agg.example:7443) with a port "
                           "in 1..65535")
        if host.startswith("[") and host.endswith("]"):
            try:
                ipaddress.IPv6Address(host[1:-1])
            except ValueError:
                raise _Invalid(f"{_show(host)} is not an IPv6 address in brackets") from None
        elif not _HOST_NAME_RE.fullmatch(host):
            raise _Invalid(f"{_show(host)} is neither a host name nor an IPv4 address "
                           "(an IPv6 address goes in brackets: [fd00::1]:7443)")

    return _Check("HOST:PORT (a name, an IPv4 address or [IPv6]) or unix:/path", run)


def _host_id() -> _Check:
    """A host's name as its certificate names it (DNS SAN), or empty."""
    def run(value: str) -> None:
        if value and not _HOST_NAME_RE.fullmatch(value):
            raise _Invalid(f"{_show(value)} is not a host name (letters, digits, '-', '_' and "
                           "dots, as in the host's certificate)")

    return _Check("a host name, or empty (the system's host name)", run)


def _label() -> _Check:
    """A free-form name shown in the fleet view (a leaf switch): printable, no spaces."""
    def run(value: str) -> None:
        if len(value) > 64:
            raise _Invalid(f"{_show(value)} is longer than 64 characters")
        for char in value:
            if char.isspace() or not char.isprintable():
                raise _Invalid(f"{_show(value)} contains {char!r}; use a name without spaces")

    return _Check("empty, or ≤ 64 printable characters without spaces", run)


def _group_name() -> _Check:
    def run(value: str) -> None:
        if value and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?", value):
            raise _Invalid(f"{_show(value)} is not a valid group name")

    return _Check("a group name, or empty", run)


def _abs_path(max_bytes: int | None = None) -> _Check:
    def run(value: str) -> None:
        if not value.startswith("/"):
            raise _Invalid(f"{_show(value)} is not an absolute path")
        if "\0" in value:
            raise _Invalid("path contains a NUL character")
        if max_bytes is not None and len(value.encode("utf-8", "surrogatepass")) > max_bytes:
            raise _Invalid(f"{_show(value)} is longer than {max_bytes} bytes, the limit for a Unix socket path")

    return _Check("absolute path" + (f", ≤ {max_bytes} bytes" if max_bytes else ""), run)


_WELL_KNOWN_COMMUNITIES = ("no-export", "no-advertise", "local-AS")


def _bgp_community() -> _Check:
    """A standard BGP community as FRR writes it: ``AA:NN`` (each 0..65535)
    or one of the well-known names."""
    def run(value: str) -> None:
        if value in _WELL_KNOWN_COMMUNITIES:
            return
        parts = value.split(":")
        if len(parts) != 2 or not all(p.isdigit() and int(p) <= 65535 for p in parts):
            raise _Invalid(f"{_show(value)} is not a BGP community (AA:NN, each 0..65535, or "
                           + ", ".join(_WELL_KNOWN_COMMUNITIES) + ")")

    return _Check("AA:NN or " + ", ".join(_WELL_KNOWN_COMMUNITIES), run)


def _empty_or(check: _Check) -> _Check:
    """`check`, or the empty string (not set)."""
    def run(value: str) -> None:
        if value != "":
            check(value)

    return _Check(f"empty, or {check.doc}", run)


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


# --- text, listening addresses and database URLs (the aggregator) ----------


def _printable() -> _Check:
    def run(value: str) -> None:
        for char in value:
            if not char.isprintable():
                raise _Invalid(f"{_show(value)} contains the control character {char!r}")

    return _Check("printable", run)


UNIX_PREFIX = "unix:"


def split_listen(text: str) -> tuple[str, int]:
    """"HOST:PORT" or "[V6]:PORT" -> (host, port); ValueError saying why not.
    Port 0 means any free port (tests)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError("expected HOST:PORT, e.g. 0.0.0.0:7443 or [::]:7443")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"{host} is not an IPv6 address") from None
        host = host[1:-1]
    elif ":" in host:
        raise ValueError("an IPv6 address needs brackets: [::]:7443")
    elif not all(part and (part.isalnum() or set(part) <= set("abcdefghijklmnopqrstuvwxyz"
                                                             "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-"))
                 for part in host.split(".")):
        raise ValueError(f"{host!r} is not an address or host name")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"port {port!r} is not a number from 0 to 65535")
    return host, int(port)


def check_unix_listen(text: str) -> str:
    """"unix:/absolute/path": a Unix socket (labs: daemons in network
    namespaces reach it through the file system). ValueError saying why not."""
    path = text[len(UNIX_PREFIX):]
    if not path.startswith("/"):
        raise ValueError(f"a Unix socket needs an absolute path: unix:/run/..., not {text!r}")
    if len(path.encode()) > SUN_PATH_MAX:
        raise ValueError(f"{path!r} is longer than a Unix socket name may be ({SUN_PATH_MAX} bytes)")
    return text


def _server_listen(*, optional: bool, unix: bool = False) -> _Check:
    """Where a server listens: HOST:PORT (a name, IPv4, or [IPv6]; port 0: any
    free port), with `unix` also unix:/abs/path, with `optional` also "" (off)."""
    def run(value: str) -> None:
        if optional and value == "":
            return
        try:
            if unix and value.startswith(UNIX_PREFIX):
                check_unix_listen(value)
            else:
                split_listen(value)
        except ValueError as exc:
            raise _Invalid(f"{_show(value)}: {exc}") from None

    doc = "HOST:PORT (a name, IPv4 or [IPv6]; port 0: any free port)"
    if unix:
        doc += ", or unix:/abs/path (≤ 107 bytes)"
    if optional:
        doc = "empty (off), or " + doc
    return _Check(doc, run)


DSN_SCHEMES = ("postgresql", "postgres")


def redacted_dsn(text: str) -> str:
    """A DSN without its password, for messages (a config error must not print it)."""
    try:
        parts = urlsplit(text)
        if parts.password is None:
            return text
        host = parts.netloc.rpartition("@")[2]
        return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))
    except ValueError:
        return "(a DSN that is not a URL)"


def _dsn() -> _Check:
    """A postgresql:// URL (the host may be a Unix socket directory:
    postgresql://user@/db?host=/run/postgresql), or empty. Shown without
    its password in every error, so it checks its own characters too."""
    def run(value: str) -> None:
        if value == "":
            return
        shown = _show(redacted_dsn(value))
        for char in value:
            if not char.isprintable():
                raise _Invalid(f"{shown} contains the control character {char!r}")
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 - raises ValueError for a bad port
        except ValueError as exc:
            raise _Invalid(f"{shown} is not a postgresql:// URL ({exc})") from None
        if parts.scheme not in DSN_SCHEMES or not value.startswith(f"{parts.scheme}://"):
            raise _Invalid(f"{shown}: expected a postgresql:// URL, e.g. "
                           "postgresql://linkpass@db.example/linkpass")
        if any(c.isspace() for c in value):
            raise _Invalid(f"{shown}: a URL has no spaces (percent-encode them)")

    return _Check("empty, or a printable `postgresql://` URL", run)
