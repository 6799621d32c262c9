"""Loading and validation: TOML text in, a validated frozen `Config` out.

Shape checks (unknown keys, types, ranges) come from the schema; the checks
across options (ownership ranges, capacity, backups, probe peers) and the
allocation of tables live here.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any, NoReturn

from linkpassd.config.checks import (
    MAX_FILE_BYTES,
    RESERVED_RULE_PRIORITIES,
    RESERVED_TABLES,
    ConfigError,
    _count,
    _got,
    _Invalid,
    _parse_interface,
    _show,
)
from linkpassd.config.schema import (
    AGGREGATOR,
    ANNOUNCE,
    BFD,
    DAEMON,
    FENCE,
    HEALTH,
    METRICS,
    MULTIPATH,
    OWNERSHIP,
    PROBES,
    RAIL,
    ROUTING,
    SCHEMA,
    SENSORS,
    TIMERS,
    Section,
)
from linkpassd.core import alloc
from linkpassd.core.bfd import BRING_UP_S as BFD_BRING_UP_S
from linkpassd.core.model import (
    AggregatorSettings,
    AnnounceSettings,
    BfdSettings,
    Config,
    FenceSettings,
    HealthPolicy,
    MultipathConfig,
    Ownership,
    ProbeSettings,
    RailConfig,
    SensorConfig,
    Timers,
)

# --------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate a config file. Every failure, I/O included, is a ConfigError."""
    source = os.fsdecode(path)
    return parse_config(read_config_text(path, "a linkpassd config"), source)


def read_config_text(path: str | os.PathLike[str], what: str) -> str:
    """A config file's text (`what` it should be names it when it is far too
    big); every failure, I/O included, is a ConfigError naming the file."""
    source = os.fsdecode(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(source, None, f"cannot read: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(source, None, f"larger than {MAX_FILE_BYTES} bytes; not {what}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            source, f"line {line}", f"not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


def parse_config(text: str, source: str = "<memory>") -> Config:
    """Validate TOML text; `source` names it in errors and in Config.source."""
    return build_config(parse_toml(text, source), source)


def parse_toml(text: str, source: str) -> dict[str, Any]:
    """TOML text -> the document; a ConfigError with the line and column when it is not TOML."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        where, reason = _toml_error_location(exc)
        raise ConfigError(source, where, f"invalid TOML: {reason}") from None
    except RecursionError:
        raise ConfigError(source, None, "invalid TOML: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer literal beyond Python's digit limit
        raise ConfigError(source, None, f"invalid TOML: {exc}") from None


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


def validate_sections(doc: Mapping[str, Any], schema: Sequence[Section],
                      source: str) -> dict[str, dict[str, Any]]:
    """Shape checks of a document whose sections are all plain tables (the
    aggregator's): unknown sections and keys, types and each option's checks.
    Every section's values, defaults filled in; checks across options are the
    caller's."""
    builder = _Builder(source, schema)
    builder.top_level(doc)
    return {section.name: builder.section(doc, section) for section in schema}


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

    def __init__(self, source: str, schema: Sequence[Section] = SCHEMA) -> None:
        self.source = source
        self.schema = schema

    def fail(self, key: str | None, reason: str) -> NoReturn:
        raise ConfigError(self.source, key, reason)

    # --- shape -------------------------------------------------------------

    def top_level(self, doc: Mapping[str, Any]) -> None:
        names = [s.name for s in self.schema]
        for key in doc:
            if key in names:
                continue
            home = next((s for s in self.schema if s.option(key)), None)
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
                    home = next((s for s in self.schema if s is not section and s.option(key)),
                                None)
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
        announce = self.section(doc, ANNOUNCE)
        fence = self.section(doc, FENCE)
        self.check_ownership(own)
        self.check_announce(announce, own)
        self.check_timers(timers)
        self.check_fence(fence)
        self.check_health(health)
        self.check_probes(probes)
        rails = self.rails(self.entries(doc, RAIL))
        self.check_fence_probes(fence, probes["enabled"], rails)
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
                    gpus=r["gpus"],
                    leaf=r["leaf"],
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
            announce=AnnounceSettings(**announce),
            fence=FenceSettings(**fence),
            auto_tables=self.auto_tables(rails, groups, probes["enabled"]),
            control_socket=daemon["control_socket"],
            run_dir=daemon["run_dir"],
            state_dir=daemon["state_dir"],
            log_format=daemon["log_format"],
            log_level=daemon["log_level"],
            control_group=daemon["control_group"],
            admin_group=daemon["admin_group"],
            event_buffer=daemon["event_buffer"],
            metrics_listen=self.section(doc, METRICS)["listen"],
            aggregator=self.aggregator(doc),
            source=self.source,
        )

    def aggregator(self, doc: Mapping[str, Any]) -> AggregatorSettings | None:
        """[aggregator], when present. The TLS files are opened here, so a
        missing or unreadable one is a config error now, not a connection
        that fails every few seconds later."""
        if AGGREGATOR.name not in doc:
            return None
        agg = self.section(doc, AGGREGATOR)
        files = [key for key in ("ca", "cert", "key") if agg[key]]
        if agg["insecure"]:
            if files:
                self.fail(f"aggregator.{files[0]}", "set together with insecure = true; use "
                          "either mutual TLS (ca, cert, key) or insecure (labs only), not both")
        else:
            for key in ("ca", "cert", "key"):
                path = agg[key]
                if not path:
                    self.fail(f"aggregator.{key}", "missing: mutual TLS needs ca, cert and key "
                              "(or insecure = true, for labs only)")
                try:
                    with open(path, "rb") as handle:
                        handle.read(1)
                except OSError as exc:
                    self.fail(f"aggregator.{key}",
                              f"cannot read {path!r}: {exc.strerror or exc}")
        address = agg.pop("address")  # one string or an array of replicas, both checked
        return AggregatorSettings(addresses=(address,) if isinstance(address, str)
                                  else tuple(address), **agg)

    def check_health(self, health: dict[str, Any]) -> None:
        if not health["flap_reuse"] < health["flap_suppress"]:
            self.fail("health.flap_reuse", f"{health['flap_reuse']:g} must be below flap_suppress "
                      f"({health['flap_suppress']:g}), or a suppressed port is never reused")
        if health["flap_suppress"] > health["flap_max_penalty"]:
            self.fail("health.flap_suppress", f"{health['flap_suppress']:g} is above "
                      f"flap_max_penalty ({health['flap_max_penalty']:g}): it could never be reached")

    def check_probes(self, probes: dict[str, Any]) -> None:
        if not probes["suspect_ms"] < probes["tolerance_ms"]:
            self.fail("probes.suspect_ms", f"{probes['suspect_ms']:g} must be below tolerance_ms "
                      f"({probes['tolerance_ms']:g}): a silence is noticed before it is judged")
        if not probes["clear_loss_ratio"] < probes["max_loss_ratio"]:
            self.fail("probes.clear_loss_ratio", f"{probes['clear_loss_ratio']:g} must be below "
                      f"max_loss_ratio ({probes['max_loss_ratio']:g}), or a degraded path "
                      "oscillates")
        for i, text in enumerate(probes["fabric_prefixes"]):
            if ipaddress.IPv4Network(text).prefixlen == 0:
                self.fail(f"probes.fabric_prefixes[{i}]", f"{_show(text)} would answer echo "
                          "requests from the whole internet (an open reflector); list the "
                          "fabric's own prefixes")

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

    def check_announce(self, announce: dict[str, Any], own: dict[str, Any]) -> None:
        if announce["table"] in RESERVED_TABLES:
            self.fail("announce.table", f"{announce['table']} is the kernel's "
                      f"{RESERVED_TABLES[announce['table']]} table")
        if own["table_min"] <= announce["table"] <= own["table_max"]:
            self.fail("announce.table", f"{announce['table']} is inside the owned table range "
                      f"{own['table_min']}..{own['table_max']}; the announcement table must be "
                      "apart from the routing tables")
        if announce["route_protocol"] == own["route_protocol"]:
            self.fail("announce.route_protocol", f"{announce['route_protocol']} is "
                      "ownership.route_protocol; announcements need their own protocol number")

    def check_fence(self, fence: dict[str, Any]) -> None:
        if fence["backoff_initial_s"] > fence["backoff_max_s"]:
            self.fail("fence.backoff_initial_s", f"{fence['backoff_initial_s']:g} is more than "
                      f"backoff_max_s ({fence['backoff_max_s']:g})")
        if not fence["test_window_s"] < fence["test_timeout_s"]:
            self.fail("fence.test_window_s", f"{fence['test_window_s']:g} must be less than "
                      f"test_timeout_s ({fence['test_timeout_s']:g}): a test could never pass")
        if not fence["test_timeout_s"] < fence["backoff_initial_s"]:
            self.fail("fence.test_timeout_s", f"{fence['test_timeout_s']:g} must be less than "
                      f"backoff_initial_s ({fence['backoff_initial_s']:g}): a port would spend "
                      "longer up in tests than fenced")

    def check_fence_probes(self, fence: dict[str, Any], probing: bool,
                           rails: list[dict[str, Any]]) -> None:
        if not fence["enabled"]:
            return
        with_bfd = [r["name"] for r in rails if r["bfd"]]
        spare = fence["test_timeout_s"] - fence["test_window_s"]
        if with_bfd and spare < BFD_BRING_UP_S:
            # A port comes up for its test with its BFD session down, and a
            # session that is not Up may send only once a second (RFC 5880
            # 6.8.3): Down, Init, Up can take two of those. A test shorter
            # than that plus the window can fail on a healthy port, and
            # doubles its backoff each time.
            self.fail("fence.test_timeout_s", f"{fence['test_timeout_s']:g} leaves "
                      f"{spare:g} s beyond test_window_s ({fence['test_window_s']:g}) for the BFD "
                      f"session of rail(s) {', '.join(with_bfd)} to come back up after the port "
                      f"does; that takes up to {BFD_BRING_UP_S:g} s (1 packet/s until Up), so a "
                      "healthy port could fail its test: make test_timeout_s at least "
                      f"test_window_s + {BFD_BRING_UP_S:g}")
        if probing:
            return
        unprobed = [r["name"] for r in rails if not r["bfd"]]
        if unprobed:
            self.fail("fence.enabled", "fencing acts on probe verdicts only (it fences on them and "
                      "unfences on them), but rail(s) " + ", ".join(unprobed) + " have no probe: "
                      "enable [probes] or set bfd = true on every rail")

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
            if ipaddress.ip_network(group["destination"]).prefixlen == 0:
                # The group's rule would be `to all`: every packet bound to no
                # rail (management, storage, DNS) would leave the main table.
                self.fail(f"{path}.destination",
                          f"{group['destination']} would take every packet not bound to a rail, "
                          "management traffic included, away from the main table; list the "
                          "fabric's prefixes instead")
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
        """Room for a fresh start (core.alloc lays rules out one slot per rail
        from the bottom, groups from the top). Later, stable numbering can
        leave gaps; core.alloc.allocate names the range when it runs out."""
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

    @staticmethod
    def auto_tables(rails: list[dict[str, Any]], groups: list[dict[str, Any]],
                    probes: bool) -> frozenset[str]:
        """The tables the file leaves to linkpassd, by core.alloc's table keys."""
        keys = {alloc.rail_table_key(r["name"]) for r in rails if r["table"] is None}
        keys |= {alloc.group_table_key(g["name"]) for g in groups if g["table"] is None}
        if probes:
            keys |= {alloc.probe_table_key(r["name"]) for r in rails if r["probe_table"] is None}
        return frozenset(keys)

    def allocate_tables(
        self, own: dict[str, Any], rails: list[dict[str, Any]], groups: list[dict[str, Any]],
        probes: bool = False,
    ) -> tuple[list[int], list[int], list[int | None]]:
        """Explicit tables first; then the lowest free ones: rails in order, then
        groups, then (with probes) the rails' probe tables. check_capacity
        guarantees enough free tables.

        This is what a fresh start uses (and what `--check-config` shows);
        the same as core.alloc.allocate without a previous allocation. A
        running daemon resolves the auto tables (Config.auto_tables) through
        its allocation instead, so they keep their numbers by name when rails
        or groups are added, removed or reordered."""
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
