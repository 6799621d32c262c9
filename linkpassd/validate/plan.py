"""The cabling plan: which switch port every host port must be cabled to.

Why a file of its own: validation proves the fabric against what the
operators *meant* to build, so the plan is the reference every finding is
judged by (a miswire is "LLDP says X, the plan says Y"). It is TOML (tomllib
is in the standard library; PyYAML is not a dependency), one table per host
port:

    [[port]]
    host = "gpu-001"
    port = "eth0"
    switch = "leaf-r0-a"
    switch_port = "Ethernet1"
    rail = "rail0"
    speed_mbps = 400000      # optional; 0 or absent: not checked

A plan with a mistake must not run on 2,000 hosts: every error names the
file, the entry (1-based, as a person counts the [[port]] tables) and the
key. Refused: unknown keys (a typo would silently drop a check), a host port
planned twice, a switch port planned twice (two cables cannot share it), and
a host with two ports on one rail (probes address a host's rail by name).
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from linkpassd._proto.linkpass.v1 import fleet_pb2

REQUIRED_KEYS = ("host", "port", "switch", "switch_port", "rail")
OPTIONAL_KEYS = ("speed_mbps",)
MAX_SPEED_MBPS = 2**32 - 1  # the proto's uint32
MAX_NAME = 200


class PlanError(ValueError):
    """A cabling plan that cannot be used; the message names where and why."""


@dataclass(frozen=True)
class PlannedPort:
    """One host port and the switch port its cable must reach."""

    host: str
    port: str
    switch: str  # the leaf the host port is cabled to
    switch_port: str
    rail: str
    speed_mbps: int = 0  # 0: not checked


@dataclass(frozen=True)
class CablingPlan:
    """A checked plan: ports in file order, no duplicates (see module doc)."""

    ports: tuple[PlannedPort, ...]
    source: str = "<plan>"

    def hosts(self) -> tuple[str, ...]:
        return tuple(sorted({p.host for p in self.ports}))

    def rails(self) -> tuple[str, ...]:
        return tuple(sorted({p.rail for p in self.ports}))

    def port_of(self, host: str, rail: str) -> PlannedPort | None:
        """The host's port on that rail (at most one: the plan refuses two)."""
        return self._by_host_rail.get((host, rail))

    def at_switch_port(self, switch: str, switch_port: str) -> PlannedPort | None:
        """The host port planned at that switch port, if any."""
        return self._by_switch_port.get((switch, switch_port))

    def leaves(self, rail: str) -> dict[str, tuple[str, ...]]:
        """switch -> its hosts on this rail (sorted)."""
        found: dict[str, list[str]] = {}
        for p in self.ports:
            if p.rail == rail:
                found.setdefault(p.switch, []).append(p.host)
        return {leaf: tuple(sorted(hosts)) for leaf, hosts in sorted(found.items())}

    def select(self, hosts: Iterable[str] = (), rails: Iterable[str] = ()) -> CablingPlan:
        """Only these hosts and rails (empty: all)."""
        host_set, rail_set = set(hosts), set(rails)
        return CablingPlan(tuple(p for p in self.ports
                                 if (not host_set or p.host in host_set) and (not rail_set or p.rail in rail_set)),
                           self.source)

    @cached_property
    def _by_host_rail(self) -> dict[tuple[str, str], PlannedPort]:
        return {(p.host, p.rail): p for p in self.ports}

    @cached_property
    def _by_switch_port(self) -> dict[tuple[str, str], PlannedPort]:
        return {(p.switch, p.switch_port): p for p in self.ports}


def load(path: str | Path) -> CablingPlan:
    """Read and check a plan file. PlanError names the file on any problem,
    unreadable file included."""
    source = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise PlanError(f"{source}: cannot read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlanError(f"{source}: not UTF-8 text (byte {exc.start})") from None
    return parse(text, source)


def parse(text: str, source: str = "<plan>") -> CablingPlan:
    """A plan from TOML text; `source` names it in errors."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(f"{source}: not valid TOML: {exc}") from None
    unknown = sorted(set(document) - {"port"})
    if unknown:
        raise PlanError(f"{source}: unknown top-level key {unknown[0]!r}: a plan is a list of [[port]] tables")
    entries = document.get("port")
    if entries is None:
        raise PlanError(f"{source}: no [[port]] entries")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise PlanError(f"{source}: 'port' must be an array of tables ([[port]]), not {type(entries).__name__}")
    return from_entries(entries, source)


def from_entries(entries: Sequence[Mapping[str, Any]], source: str = "<plan>") -> CablingPlan:
    """A plan from already-parsed entries (dicts with the keys above)."""
    if not entries:
        raise PlanError(f"{source}: no [[port]] entries")
    ports = [_entry(entry, source, index) for index, entry in enumerate(entries, start=1)]
    return _checked(ports, source)


def to_proto(port: PlannedPort) -> fleet_pb2.PlannedPort:
    return fleet_pb2.PlannedPort(host=port.host, port=port.port, switch_name=port.switch,
                                 switch_port=port.switch_port, rail=port.rail, speed_mbps=port.speed_mbps)


def from_proto(message: fleet_pb2.PlannedPort) -> PlannedPort:
    """One port as a request carries it (not checked: see plan_from_proto)."""
    return PlannedPort(host=message.host, port=message.port, switch=message.switch_name,
                       switch_port=message.switch_port, rail=message.rail, speed_mbps=message.speed_mbps)


def plan_to_proto(plan: CablingPlan) -> list[fleet_pb2.PlannedPort]:
    return [to_proto(p) for p in plan.ports]


def plan_from_proto(messages: Iterable[fleet_pb2.PlannedPort], source: str = "request plan") -> CablingPlan:
    """A plan as a ValidateRequest carries it, checked like a file: what
    arrives over the wire gets the same errors (entry numbers are 1-based
    positions in the repeated field)."""
    entries = [{"host": m.host, "port": m.port, "switch": m.switch_name, "switch_port": m.switch_port,
                "rail": m.rail, "speed_mbps": m.speed_mbps} for m in messages]
    return from_entries(entries, source)


# --------------------------------------------------------------------------


def _entry(entry: Mapping[str, Any], source: str, index: int) -> PlannedPort:
    where = f"{source}: port entry {index}"
    if not isinstance(entry, Mapping):
        raise PlanError(f"{where}: must be a table, not {type(entry).__name__}")
    unknown = sorted(set(entry) - set(REQUIRED_KEYS) - set(OPTIONAL_KEYS))
    if unknown:
        raise PlanError(f"{where}: unknown key {unknown[0]!r} (keys: {', '.join(REQUIRED_KEYS + OPTIONAL_KEYS)})")
    values: dict[str, Any] = {}
    for key in REQUIRED_KEYS:
        if key not in entry:
            raise PlanError(f"{where}: missing key {key!r}")
        value = entry[key]
        if not isinstance(value, str):
            raise PlanError(f"{where}: key {key!r} must be a string, not {type(value).__name__} ({value!r})")
        value = value.strip()
        if not value:
            raise PlanError(f"{where}: key {key!r} is empty")
        if len(value) > MAX_NAME or any(ch.isspace() or not ch.isprintable() for ch in value):
            raise PlanError(f"{where}: key {key!r} = {value[:MAX_NAME]!r}: a name of at most {MAX_NAME} "
                            "printable characters without spaces")
        values[key] = value
    speed = entry.get("speed_mbps", 0)
    if isinstance(speed, bool) or not isinstance(speed, int) or not 0 <= speed <= MAX_SPEED_MBPS:
        raise PlanError(f"{where}: key 'speed_mbps' = {speed!r}: an integer from 0 (not checked) to {MAX_SPEED_MBPS}")
    return PlannedPort(speed_mbps=speed, **values)


def _checked(ports: list[PlannedPort], source: str) -> CablingPlan:
    """Refuse duplicates, naming both entries."""
    host_port: dict[tuple[str, str], int] = {}
    switch_port: dict[tuple[str, str], int] = {}
    host_rail: dict[tuple[str, str], int] = {}
    for index, p in enumerate(ports, start=1):
        for seen, key, what in ((host_port, (p.host, p.port), f"host port {p.host} {p.port}"),
                                (switch_port, (p.switch, p.switch_port), f"switch port {p.switch} {p.switch_port}"),
                                (host_rail, (p.host, p.rail), f"host {p.host} on rail {p.rail}")):
            first = seen.setdefault(key, index)
            if first != index:
                hint = (" (one port per host per rail: probes address a host's rail by name)"
                        if seen is host_rail else "")
                raise PlanError(f"{source}: port entry {index}: {what} is already planned in entry {first}{hint}")
    return CablingPlan(tuple(ports), source)
