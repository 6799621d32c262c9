"""Config loading: one-line errors with exact key paths, defaults, table allocation,
the generated reference, and `--check-config` output. Pure: files only under tmp_path."""

from __future__ import annotations

import dataclasses
import os
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from linkpassd import config as cfgmod
from linkpassd.config import (
    SCHEMA,
    ConfigError,
    build_config,
    check_config_main,
    load_config,
    parse_config,
    render_reference_markdown,
)
from linkpassd.config.reference import _toml_literal as toml_literal
from linkpassd.core.model import (
    AggregatorSettings,
    BfdSettings,
    Config,
    MultipathConfig,
    Ownership,
    ProbeSettings,
    RailConfig,
    Timers,
)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "linkpassd.toml"
DOCS = REPO / "docs" / "config.md"

# Every section present, so each malformed case is one readable edit of this text.
BASE = """\
[daemon]
log_format = "kv"
log_level = "info"

[ownership]
route_protocol = 201
table_min = 10100
table_max = 10199
rule_priority_min = 10100
rule_priority_max = 10199
nexthop_id_min = 1000100
nexthop_id_max = 1000199

[timers]
rise = 3
fall = 1
hold_down_s = 5.0
tick_interval_s = 0.5
resync_interval_s = 30.0

[routing]
roce_rules = true

[probes]
enabled = false
interval_ms = 50.0

[[rail]]
name = "rail0"
port = "eth0"
address = "198.18.0.1/24"
gateway = "198.18.0.254"
backups = ["rail1"]
destinations = ["0.0.0.0/0"]

[[rail]]
name = "rail1"
port = "eth1"
address = "198.18.1.1/24"
gateway = "198.18.1.254"
backups = ["rail0"]

[[multipath]]
name = "fabric"
destination = "198.18.128.0/17"
rails = ["rail0", "rail1"]
buckets = 64
idle_timer_s = 0
unbalanced_timer_s = 0
min_paths = 1
"""

MINIMAL_RAIL = """\
[[rail]]
name = "rail0"
port = "eth0"
address = "198.18.0.1/24"
gateway = "198.18.0.254"
"""


def edit(*pairs: str) -> str:
    """BASE with each (old, new) pair replaced; old must occur exactly once."""
    text = BASE
    for old, new in zip(pairs[::2], pairs[1::2]):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


def rail1(old: str, new: str) -> str:
    """Edit inside the second [[rail]] only."""
    head, sep, tail = BASE.partition('name = "rail1"')
    assert tail.count(old) >= 1, old
    return head + sep + tail.replace(old, new, 1)


# (id, text, exact key path, fragment of the reason)
MALFORMED = [
    ("toml-syntax", edit('log_level = "info"', 'log_level = "info'), "line 3, column 18",
     "invalid TOML"),
    ("toml-duplicate-key", edit("rise = 3", "rise = 3\nrise = 4"), "line 16, column 9",
     "invalid TOML"),
    ("unknown-section", edit("[timers]", "[timer]"), "timer", "did you mean 'timers'"),
    ("unknown-key-suggested", rail1('gateway = "198.18.1.254"', 'gatway = "198.18.1.254"'),
     "rail[1].gatway", "did you mean 'gateway'"),
    ("unknown-key-no-suggestion", edit("[routing]", "[routing]\nflavour = 1"),
     "routing.flavour", "unknown key"),
    ("key-in-wrong-section", edit("roce_rules = true", "roce_rules = true\nrise = 2"),
     "routing.rise", "belongs in [timers]"),
    ("key-outside-sections", 'log_level = "debug"\n' + BASE, "log_level", "belongs in [daemon]"),
    ("rail-as-table", MINIMAL_RAIL.replace("[[rail]]", "[rail]"), "rail", "write [[rail]]"),
    ("bool-is-not-int", edit("rise = 3", "rise = true"), "timers.rise",
     "expected an integer, got boolean true"),
    ("string-for-int", edit("table_min = 10100", 'table_min = "10100"'), "ownership.table_min",
     "expected an integer, got string '10100'"),
    ("float-for-int", edit("buckets = 64", "buckets = 64.0"), "multipath[0].buckets",
     "expected an integer, got float 64.0"),
    ("string-for-bool", edit("roce_rules = true", 'roce_rules = "yes"'), "routing.roce_rules",
     "expected true or false"),
    ("nan", edit("hold_down_s = 5.0", "hold_down_s = nan"), "timers.hold_down_s", "finite"),
    ("backups-not-strings", edit('backups = ["rail1"]', "backups = [1]"), "rail[0].backups[0]",
     "expected a string, got integer 1"),
    ("missing-required", rail1('gateway = "198.18.1.254"\n', ""), "rail[1].gateway",
     "missing required key"),
    ("missing-multipath-rails", edit('rails = ["rail0", "rail1"]\n', ""), "multipath[0].rails",
     "missing required key"),
    ("bad-ipv4", rail1('gateway = "198.18.1.254"', 'gateway = "198.18.0.300"'),
     "rail[1].gateway", "'198.18.0.300' is not an IPv4 address"),
    ("ipv6-address", edit('address = "198.18.0.1/24"', 'address = "fd00::1/64"'),
     "rail[0].address", "IPv6 is not supported yet"),
    ("multipath-default-route", edit('destination = "198.18.128.0/17"', 'destination = "0.0.0.0/0"'),
     "multipath[0].destination", "away from the main table"),
    ("ipv6-destination", edit('destinations = ["0.0.0.0/0"]', 'destinations = ["::/0"]'),
     "rail[0].destinations[0]", "IPv6 is not supported yet"),
    ("address-without-prefix", edit('address = "198.18.0.1/24"', 'address = "198.18.0.1"'),
     "rail[0].address", "prefix length"),
    ("prefix-too-long", edit('address = "198.18.0.1/24"', 'address = "198.18.0.1/33"'),
     "rail[0].address", "invalid prefix length '33'"),
    ("netmask-not-prefix", edit('address = "198.18.0.1/24"', 'address = "198.18.0.1/255.255.255.0"'),
     "rail[0].address", "invalid prefix length"),
    ("address-is-network", edit('address = "198.18.0.1/24"', 'address = "198.18.0.0/24"'),
     "rail[0].address", "network address"),
    ("loopback-gateway", edit('gateway = "198.18.0.254"', 'gateway = "127.0.0.1"'),
     "rail[0].gateway", "loopback"),
    ("gateway-outside-subnet", edit('gateway = "198.18.0.254"', 'gateway = "198.18.1.254"'),
     "rail[0].gateway", "not inside the rail subnet 198.18.0.0/24"),
    ("gateway-is-address", edit('gateway = "198.18.0.254"', 'gateway = "198.18.0.1"'),
     "rail[0].gateway", "own address"),
    ("destination-host-bits", edit('destinations = ["0.0.0.0/0"]',
                                   'destinations = ["0.0.0.0/0", "10.1.0.0/8"]'),
     "rail[0].destinations[1]", "host bits set; the network is '10.0.0.0/8'"),
    ("destinations-empty", edit('destinations = ["0.0.0.0/0"]', "destinations = []"),
     "rail[0].destinations", "must not be empty"),
    ("destinations-repeated", edit('destinations = ["0.0.0.0/0"]',
                                   'destinations = ["0.0.0.0/0", "0.0.0.0/0"]'),
     "rail[0].destinations[1]", "listed twice"),
    ("fabric-prefixes-everything", edit("interval_ms = 50.0",
                                        'interval_ms = 50.0\nfabric_prefixes = ["0.0.0.0/0"]'),
     "probes.fabric_prefixes[0]", "whole internet"),
    ("fabric-prefixes-not-cidr", edit("interval_ms = 50.0",
                                      'interval_ms = 50.0\nfabric_prefixes = ["198.18.0.0"]'),
     "probes.fabric_prefixes[0]", "needs a prefix length"),
    ("fabric-prefixes-repeated", edit("interval_ms = 50.0", 'interval_ms = 50.0\n'
                                      'fabric_prefixes = ["198.18.0.0/16", "198.18.0.0/16"]'),
     "probes.fabric_prefixes[1]", "listed twice"),
    ("probe-peers-without-probing", rail1('backups = ["rail0"]',
                                          'backups = ["rail0"]\nprobe_peers = ["198.18.3.1"]'),
     "rail[1].probe_peers", "[probes] enabled is false"),
    ("probe-peer-in-rail-subnet", edit("enabled = false", "enabled = true",
                                       'destinations = ["0.0.0.0/0"]',
                                       'destinations = ["0.0.0.0/0"]\nprobe_peers = ["198.18.0.7"]'),
     "rail[0].probe_peers[0]", "inside the rail subnet 198.18.0.0/24"),
    ("probe-peer-is-own-rail", edit("enabled = false", "enabled = true",
                                    'destinations = ["0.0.0.0/0"]',
                                    'destinations = ["0.0.0.0/0"]\nprobe_peers = ["198.18.1.1"]'),
     "rail[0].probe_peers[0]", "the address of rail 'rail1' on this host"),
    ("probe-peer-outside-destinations",
     edit("enabled = false", "enabled = true", 'destinations = ["0.0.0.0/0"]',
          'destinations = ["198.19.0.0/16"]\nprobe_peers = ["198.20.0.1"]'),
     "rail[0].probe_peers[0]", "not inside the rail's destinations (198.19.0.0/16)"),
    ("probe-peer-not-an-address", edit('destinations = ["0.0.0.0/0"]',
                                       'destinations = ["0.0.0.0/0"]\nprobe_peers = ["lph7"]'),
     "rail[0].probe_peers[0]", "'lph7' is not an IPv4 address"),
    ("probe-peers-repeated", edit("enabled = false", "enabled = true",
                                  'destinations = ["0.0.0.0/0"]',
                                  'destinations = ["0.0.0.0/0"]\n'
                                  'probe_peers = ["198.18.3.1", "198.18.3.1"]'),
     "rail[0].probe_peers[1]", "listed twice"),
    ("probe-suspect-not-below-tolerance", edit("interval_ms = 50.0",
                                                "interval_ms = 50.0\nsuspect_ms = 30"),
     "probes.suspect_ms", "must be below tolerance_ms (30)"),
    ("probe-one-confirmation", edit("interval_ms = 50.0", "interval_ms = 50.0\nconfirm_probes = 1"),
     "probes.confirm_probes", "outside 2..32"),
    ("probe-removed-timeout", edit("interval_ms = 50.0", "interval_ms = 50.0\ntimeout_ms = 8"),
     "probes.timeout_ms", "unknown"),
    ("probe-clear-above-max", edit("interval_ms = 50.0", "interval_ms = 50.0\nclear_loss_ratio = 0.3"),
     "probes.clear_loss_ratio", "must be below max_loss_ratio (0.2)"),
    ("probe-port-out-of-range", edit("interval_ms = 50.0", "interval_ms = 50.0\nport = 70000"),
     "probes.port", "outside 1..65535"),
    ("probe-table-taken", edit("enabled = false", "enabled = true", 'port = "eth0"',
                               'port = "eth0"\nprobe_table = 10150', 'port = "eth1"',
                               'port = "eth1"\ntable = 10150'),
     "rail[0].probe_table", "table 10150 is already used by rail[1]"),
    ("probe-tables-do-not-fit", edit("enabled = false", "enabled = true",
                                     "table_max = 10199", "table_max = 10103"),
     "ownership.table_max", "need 5 tables: 2 per rail with probes"),
    ("table-min-over-max", edit("table_min = 10100", "table_min = 10200"), "ownership.table_min",
     "greater than table_max"),
    ("nexthop-min-over-max", edit("nexthop_id_max = 1000199", "nexthop_id_max = 1000000"),
     "ownership.nexthop_id_min", "greater than nexthop_id_max"),
    ("table-range-too-small", edit("table_max = 10199", "table_max = 10101"),
     "ownership.table_max", "has room for 2, but 2 rails and 1 multipath group need 3 tables"),
    ("priority-range-too-small", edit("rule_priority_max = 10199", "rule_priority_max = 10103"),
     "ownership.rule_priority_max",
     "has room for 4, but 2 rails and 1 multipath group need 5 rule priorities: 2 per rail with roce_rules"),
    ("nexthop-range-too-small", edit("nexthop_id_max = 1000199", "nexthop_id_max = 1000100"),
     "ownership.nexthop_id_max", "has room for 1, but 2 rails and 1 multipath group need 3 nexthop ids"),
    ("table-range-includes-main", edit("table_min = 10100", "table_min = 200"),
     "ownership.table_min", "includes 253 (default)"),
    ("priority-range-includes-main-rule", edit("rule_priority_max = 10199", "rule_priority_max = 32766"),
     "ownership.rule_priority_min", "includes 32766"),
    ("table-outside-range", rail1('port = "eth1"', 'port = "eth1"\ntable = 254'),
     "rail[1].table", "outside the owned table range 10100..10199"),
    ("table-used-twice", edit("buckets = 64", "buckets = 64\ntable = 10105",
                              'port = "eth0"', 'port = "eth0"\ntable = 10105'),
     "multipath[0].table", "already used by rail[0]"),
    ("duplicate-rail-name", edit('name = "rail1"', 'name = "rail0"'), "rail[1].name",
     "already used by rail[0]"),
    ("duplicate-port", rail1('port = "eth1"', 'port = "eth0"'), "rail[1].port",
     "'eth0' is already used by rail[0]"),
    ("duplicate-address", rail1('address = "198.18.1.1/24"', 'address = "198.18.0.1/16"'),
     "rail[1].address", "'198.18.0.1' is already used by rail[0]"),
    ("port-name-too-long", edit('port = "eth0"', 'port = "enp1s0f0np0-rail0"'), "rail[0].port",
     "longer than 15 bytes"),
    ("port-name-slash", edit('port = "eth0"', 'port = "eth/0"'), "rail[0].port",
     "not a valid interface name"),
    ("rail-name-spaces", edit('name = "rail0"', 'name = "rail 0"'), "rail[0].name",
     "not a valid name"),
    ("backup-unknown", edit('backups = ["rail1"]', 'backups = ["rail2"]'), "rail[0].backups[0]",
     "unknown rail 'rail2'; did you mean 'rail1'?"),
    ("backup-self", edit('backups = ["rail1"]', 'backups = ["rail0"]'), "rail[0].backups[0]",
     "cannot back up itself"),
    ("backup-repeated", edit('backups = ["rail1"]', 'backups = ["rail1", "rail1"]'),
     "rail[0].backups[1]", "listed twice"),
    ("multipath-rail-unknown", edit('rails = ["rail0", "rail1"]', 'rails = ["rail0", "eth1"]'),
     "multipath[0].rails[1]", "unknown rail 'eth1'; rails are rail0, rail1"),
    ("multipath-rail-repeated", edit('rails = ["rail0", "rail1"]', 'rails = ["rail0", "rail0"]'),
     "multipath[0].rails[1]", "listed twice"),
    ("multipath-rails-empty", edit('rails = ["rail0", "rail1"]', "rails = []"),
     "multipath[0].rails", "must not be empty"),
    ("min-paths-zero", edit("min_paths = 1", "min_paths = 0"), "multipath[0].min_paths",
     "less than 1"),
    ("min-paths-over-rails", edit("min_paths = 1", "min_paths = 3"), "multipath[0].min_paths",
     "more than the group's 2 rails"),
    ("buckets-zero", edit("buckets = 64", "buckets = 0"), "multipath[0].buckets",
     "outside 1..65535"),
    ("buckets-too-many", edit("buckets = 64", "buckets = 65536"), "multipath[0].buckets",
     "outside 1..65535"),
    ("buckets-fewer-than-rails", edit("buckets = 64", "buckets = 1"), "multipath[0].buckets",
     "use at least 2"),
    ("idle-timer-negative", edit("idle_timer_s = 0", "idle_timer_s = -1"),
     "multipath[0].idle_timer_s", "outside 0.."),
    ("unbalanced-timer-negative", edit("unbalanced_timer_s = 0", "unbalanced_timer_s = -5"),
     "multipath[0].unbalanced_timer_s", "outside 0.."),
    ("rise-zero", edit("rise = 3", "rise = 0"), "timers.rise", "less than 1"),
    ("fall-zero", edit("fall = 1", "fall = 0"), "timers.fall", "less than 1"),
    ("hold-down-negative", edit("hold_down_s = 5.0", "hold_down_s = -0.5"), "timers.hold_down_s",
     "less than 0"),
    ("tick-zero", edit("tick_interval_s = 0.5", "tick_interval_s = 0"), "timers.tick_interval_s",
     "greater than 0"),
    ("resync-below-tick", edit("resync_interval_s = 30.0", "resync_interval_s = 0.25"),
     "timers.resync_interval_s", "shorter than tick_interval_s"),
    ("log-format", edit('log_format = "kv"', 'log_format = "text"'), "daemon.log_format",
     "'text' is not one of kv, json"),
    ("probes-clock", edit("interval_ms = 50.0", 'interval_ms = 50.0\nclock = "ntpd"'),
     "probes.clock", "'ntpd' is not one of auto, chrony, ptp4l, none, shared"),
    ("log-level", edit('log_level = "info"', 'log_level = "verbose"'), "daemon.log_level",
     "not one of debug, info, warning, error"),
    ("relative-socket", edit('[daemon]', '[daemon]\ncontrol_socket = "linkpassd.sock"'),
     "daemon.control_socket", "not an absolute path"),
    ("route-protocol-static", edit("route_protocol = 201", "route_protocol = 4"),
     "ownership.route_protocol", "4 is reserved for static"),
    ("route-protocol-negative", edit("route_protocol = 201", "route_protocol = -1"),
     "ownership.route_protocol", "outside 5..255"),
    ("route-protocol-bgp", edit("route_protocol = 201", "route_protocol = 186"),
     "ownership.route_protocol", "reserved for bgp"),
    ("route-protocol-too-big", edit("route_protocol = 201", "route_protocol = 256"),
     "ownership.route_protocol", "outside 5..255"),
    ("zero-rails", "[daemon]\n", "rail", "at least one [[rail]] is required"),
    ("empty-file", "", "rail", "at least one [[rail]] is required"),
    ("duplicate-multipath-name", BASE + BASE[BASE.index("[[multipath]]"):].replace(
        "198.18.128.0/17", "198.19.0.0/16"), "multipath[1].name", "already used by multipath[0]"),
    ("control-char-in-key", edit("[routing]", '[routing]\n"a\\nb" = 1'), 'routing."a\\nb"',
     "unknown key"),
]


@pytest.mark.parametrize("text,key,reason", [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_malformed_config_is_one_precise_line(text, key, reason):
    with pytest.raises(ConfigError) as info:  # anything else propagates and fails the test
        parse_config(text, "linkpassd.toml")
    message = str(info.value)
    assert len(message.splitlines()) == 1 and "\n" not in message
    assert info.value.key == key
    assert message.startswith(f"linkpassd.toml: {key}: "), message
    assert reason in info.value.reason, message
    assert info.value.reason.strip()


def test_enough_distinct_malformed_cases():
    assert len({c[0] for c in MALFORMED}) == len(MALFORMED) >= 15
    assert len({c[1] for c in MALFORMED}) == len(MALFORMED)


def test_base_is_valid():
    config = parse_config(BASE, "linkpassd.toml")
    assert [r.name for r in config.rails] == ["rail0", "rail1"]


# --- defaults and allocation ----------------------------------------------


def _defaults_toml() -> str:
    """Every optional option written out with its declared default."""
    lines = []
    for section in SCHEMA:
        values = [o for o in section.options if not o.required and o.default is not None]
        if section.array or section.switch:  # a switch section's presence turns it on
            continue
        lines.append(f"[{section.name}]")
        lines += [f"{o.key} = {toml_literal(o.default)}" for o in values]
    return "\n".join(lines) + "\n"


def test_minimal_config_takes_model_defaults():
    config = parse_config(MINIMAL_RAIL, "min.toml")
    assert config == Config(
        rails=(RailConfig(name="rail0", port="eth0", address="198.18.0.1", prefixlen=24,
                          gateway="198.18.0.254", table=10100),),
        auto_tables=frozenset({"rail:rail0"}),  # the file left rail0's table to linkpassd
        source="min.toml",
    )


def test_writing_every_default_explicitly_changes_nothing():
    explicit = _defaults_toml() + "\n" + MINIMAL_RAIL.replace(
        "[[rail]]", '[[rail]]\nbackups = []\ndestinations = ["0.0.0.0/0"]')
    assert parse_config(explicit, "min.toml") == parse_config(MINIMAL_RAIL, "min.toml")


def _model_default(cls, name):
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


@pytest.mark.parametrize("section,cls", [
    ("daemon", Config), ("ownership", Ownership), ("timers", Timers),
    ("routing", Config), ("rail", RailConfig), ("multipath", MultipathConfig),
    ("probes", ProbeSettings), ("bfd", BfdSettings), ("aggregator", AggregatorSettings),
])
def test_schema_defaults_match_the_model(section, cls):
    """The model's defaults (used by tests that build Config directly) and the file's agree."""
    spec = next(s for s in SCHEMA if s.name == section)
    fields = {f.name for f in dataclasses.fields(cls)}
    checked = 0
    for opt in spec.options:
        if opt.required or opt.default is None:
            continue
        assert opt.key in fields, opt.key
        assert opt.default == _model_default(cls, opt.key), opt.key
        checked += 1
    assert checked


def test_schema_defaults_pass_their_own_checks():
    for section in SCHEMA:
        for opt in section.options:
            if not opt.required and opt.default is not None:
                for check in opt.checks:
                    check(opt.type.convert(list(opt.default) if isinstance(opt.default, tuple)
                                           else opt.default))


def test_tables_allocated_in_rail_order_then_groups():
    config = parse_config(BASE, "t.toml")
    assert [r.table for r in config.rails] == [10100, 10101]
    assert [g.table for g in config.multipath] == [10102]


def test_allocation_skips_explicit_tables():
    text = rail1('port = "eth1"', 'port = "eth1"\ntable = 10100')
    config = parse_config(text, "t.toml")
    assert [r.table for r in config.rails] == [10101, 10100]
    assert config.multipath[0].table == 10102


def test_allocation_fills_an_exactly_sized_range():
    text = edit("table_max = 10199", "table_max = 10102",
                'port = "eth0"', 'port = "eth0"\ntable = 10101')
    config = parse_config(text, "t.toml")
    assert sorted([r.table for r in config.rails] + [config.multipath[0].table]) == [10100, 10101, 10102]


def test_probe_tables_come_after_groups_and_peers_are_kept():
    text = edit("enabled = false", "enabled = true", 'destinations = ["0.0.0.0/0"]',
                'destinations = ["0.0.0.0/0"]\nprobe_peers = ["198.18.3.1", "198.18.5.1"]')
    config = parse_config(text, "t.toml")
    assert [r.probe_table for r in config.rails] == [10103, 10104]
    assert config.rails[0].probe_peers == ("198.18.3.1", "198.18.5.1")
    assert config.rails[1].probe_peers == ()
    assert config.probes.enabled and config.probes.port == 4793


def test_probe_tables_are_not_allocated_while_probing_is_off():
    config = parse_config(BASE, "t.toml")
    assert [r.probe_table for r in config.rails] == [None, None]


def test_priority_need_drops_without_roce_rules():
    text = edit("rule_priority_max = 10199", "rule_priority_max = 10102",
                "roce_rules = true", "roce_rules = false")
    assert parse_config(text, "t.toml").roce_rules is False


def test_address_split_into_address_and_prefixlen():
    config = parse_config(MINIMAL_RAIL.replace("198.18.0.1/24", "198.18.0.1/15")
                          .replace("198.18.0.254", "198.19.255.254"), "t.toml")
    assert (config.rails[0].address, config.rails[0].prefixlen) == ("198.18.0.1", 15)


def test_point_to_point_rail_subnet():
    config = parse_config(MINIMAL_RAIL.replace("198.18.0.1/24", "198.18.0.0/31")
                          .replace("198.18.0.254", "198.18.0.1"), "t.toml")
    assert config.rails[0].address == "198.18.0.0"


# --- example and reference -----------------------------------------------


def test_example_config_validates():
    config = load_config(EXAMPLE)
    assert len(config.rails) == 2 and len(config.multipath) == 1
    for rail in config.rails:
        assert rail.address.startswith("198.18.") or rail.address.startswith("198.19.")
    assert config.source == str(EXAMPLE)


def test_committed_reference_matches_schema():
    assert DOCS.read_text(encoding="utf-8") == render_reference_markdown(), (
        "docs/config.md is stale: run `.venv/bin/python -m linkpassd.config --reference > docs/config.md`")


def test_reference_documents_every_option():
    doc = render_reference_markdown()
    for section in SCHEMA:
        assert f"`{section.header}`" in doc
        for opt in section.options:
            assert f"| `{opt.key}` |" in doc


# --- check_config_main --------------------------------------------------------


def test_check_config_ok(capsys):
    assert check_config_main(EXAMPLE) == 0
    out, err = capsys.readouterr()
    assert out == f"OK: {EXAMPLE}: 2 rails, 1 multipath group\n"
    assert err == ""


def test_check_config_counts(tmp_path, capsys):
    path = tmp_path / "one.toml"
    path.write_text(MINIMAL_RAIL)
    assert check_config_main(str(path)) == 0
    assert capsys.readouterr().out == f"OK: {path}: 1 rail, 0 multipath groups\n"


def _check_fails(path, capsys) -> str:
    assert check_config_main(path) != 0
    out, err = capsys.readouterr()
    assert out == ""
    assert err.endswith("\n") and len(err.splitlines()) == 1, err
    assert "Traceback" not in err
    return err.rstrip("\n")


def test_check_config_invalid(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text(rail1('gateway = "198.18.1.254"', 'gateway = "198.18.0.300"'))
    assert _check_fails(path, capsys) == (
        f"{path}: rail[1].gateway: '198.18.0.300' is not an IPv4 address")


def test_check_config_missing_file(tmp_path, capsys):
    path = tmp_path / "nope.toml"
    assert _check_fails(path, capsys) == f"{path}: cannot read: No such file or directory"


def test_check_config_directory(tmp_path, capsys):
    assert _check_fails(tmp_path, capsys) == f"{tmp_path}: cannot read: Is a directory"


def test_check_config_not_utf8(tmp_path, capsys):
    path = tmp_path / "latin1.toml"
    path.write_bytes(MINIMAL_RAIL.encode() + b'# caf\xe9\n')
    offset = len(MINIMAL_RAIL) + len("# caf")
    assert _check_fails(path, capsys) == (
        f"{path}: line 6: not valid UTF-8 (byte 0xe9 at offset {offset})")


def test_check_config_too_large(tmp_path, capsys):
    path = tmp_path / "huge.toml"
    path.write_bytes(b"#" * (cfgmod.MAX_FILE_BYTES + 1))
    assert "larger than" in _check_fails(path, capsys)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files regardless of mode")
def test_check_config_unreadable(tmp_path, capsys):
    path = tmp_path / "secret.toml"
    path.write_text(MINIMAL_RAIL)
    path.chmod(0)
    assert _check_fails(path, capsys) == f"{path}: cannot read: Permission denied"


def test_check_config_odd_file_name_stays_one_line(tmp_path, capsys):
    path = tmp_path / "a\nb.toml"
    path.write_text("[daemon]\nlog_level = 1\n")
    err = _check_fails(path, capsys)
    assert err.endswith(": daemon.log_level: expected a string, got integer 1")


def test_deep_nesting_and_huge_integers_are_config_errors():
    for text in ("x = " + "[" * 5000, "rise = " + "1" * 5000):
        with pytest.raises(ConfigError):
            parse_config(text, "t.toml")


# --- only ConfigError, whatever the input ---------------------------------------

_toml_scalars = st.one_of(
    st.booleans(), st.integers(), st.floats(), st.text(max_size=20),
    st.sampled_from(["198.18.0.1/24", "198.18.0.254", "0.0.0.0/0", "rail0", "rail1", "eth0", "::1",
                     "kv", "json", "debug", "/run/x"]),
)
_toml_values = st.recursive(
    _toml_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_mutation_of_a_valid_document_is_config_or_configerror(data):
    doc = tomllib.loads(BASE)
    # Pick a path into the document and replace (or add, or delete) what is there.
    node = doc
    for _ in range(data.draw(st.integers(0, 2))):
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        child = node[data.draw(st.sampled_from(keys))] if keys else None
        if not isinstance(child, (dict, list)) or not child:
            break
        node = child
    if isinstance(node, dict):
        key = data.draw(st.sampled_from(list(node) + ["extra"]))
    else:
        key = data.draw(st.integers(0, len(node) - 1))
    if data.draw(st.booleans()) and key in (node if isinstance(node, dict) else range(len(node))):
        del node[key]
    else:
        node[key] = data.draw(_toml_values)
    try:
        build_config(doc, "fuzz.toml")
    except ConfigError as exc:
        assert len(str(exc).splitlines()) == 1
        assert str(exc).startswith("fuzz.toml: ")


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=200))
def test_any_text_is_config_or_configerror(text):
    try:
        parse_config(text, "fuzz.toml")
    except ConfigError as exc:
        assert len(str(exc).splitlines()) == 1


# --- [aggregator] and the rails' gpus/leaf ------------------------------------


def _tls_files(tmp_path) -> dict[str, str]:
    paths = {}
    for name in ("ca", "cert", "key"):
        path = tmp_path / f"{name}.pem"
        path.write_text("-----BEGIN TEST-----\n")
        paths[name] = str(path)
    return paths


def _with_aggregator(**keys: object) -> str:
    body = "\n".join(f"{k} = {toml_literal(v)}" for k, v in keys.items())
    return MINIMAL_RAIL + "\n[aggregator]\n" + body + "\n"


def test_without_an_aggregator_section_linkpassd_is_standalone():
    assert parse_config(BASE, "t.toml").aggregator is None


def test_an_aggregator_with_mutual_tls_files_is_taken_as_written(tmp_path):
    files = _tls_files(tmp_path)
    config = parse_config(_with_aggregator(address="agg.example:7443", host_id="gpu-017",
                                           spool_max_events=500, **files), "t.toml")
    assert config.aggregator == AggregatorSettings(addresses=("agg.example:7443",),
                                                   host_id="gpu-017", spool_max_events=500,
                                                   **files)
    assert config.aggregator.address == "agg.example:7443"


def test_an_aggregator_on_a_unix_socket_is_accepted():
    config = parse_config(_with_aggregator(address="unix:/tmp/lplab-x/agg.sock", insecure=True),
                          "t.toml")
    assert config.aggregator.address == "unix:/tmp/lplab-x/agg.sock"


def test_aggregator_replicas_are_an_array_of_addresses_kept_in_order():
    replicas = ["agg-2.example:7443", "unix:/tmp/lplab-x/agg.sock", "[fd00::1]:7443",
                "198.18.0.9:7443"]
    config = parse_config(_with_aggregator(address=replicas, insecure=True), "t.toml")
    assert config.aggregator.addresses == tuple(replicas)
    assert config.aggregator.address == "agg-2.example:7443"  # the one tried first
    one = parse_config(_with_aggregator(address=["agg.example:7443"], insecure=True), "t.toml")
    assert one.aggregator == parse_config(
        _with_aggregator(address="agg.example:7443", insecure=True), "t.toml").aggregator


@pytest.mark.parametrize("address,key,reason", [
    ([], "aggregator.address", "an empty array; list at least one address"),
    (["a:1", "agg.example"], "aggregator.address[1]", "'agg.example' is not HOST:PORT"),
    (["agg.example:0", "a:1"], "aggregator.address[0]", "port in 1..65535"),
    (["a:1", "b:2", "agg example:7443"], "aggregator.address[2]",
     "neither a host name nor an IPv4 address"),
    (["a:1", "[fd00::zz]:7443"], "aggregator.address[1]", "not an IPv6 address"),
    (["a:1", "unix:agg.sock"], "aggregator.address[1]", "absolute path"),
    (["a:1", "b:2", "a:1"], "aggregator.address[2]", "'a:1' is listed twice (also at [0])"),
    (["a:1", 7443], "aggregator.address[1]", "expected a string, got integer 7443"),
    ([["a:1"]], "aggregator.address[0]", "expected a string, got an array"),
    (7443, "aggregator.address", "expected a string or an array of strings, got integer"),
])
def test_a_bad_aggregator_replica_list_names_the_element(address, key, reason):
    with pytest.raises(ConfigError) as info:
        parse_config(_with_aggregator(address=address, insecure=True), "t.toml")
    assert info.value.key == key and reason in info.value.reason, str(info.value)


def test_aggregator_settings_refuse_a_bare_string_or_no_address():
    """A str is iterable: ("a:1") would be five one-letter addresses."""
    for bad in ("agg.example:7443", ()):
        with pytest.raises(ValueError, match="non-empty tuple"):
            AggregatorSettings(addresses=bad)


def test_an_insecure_aggregator_needs_no_files():
    config = parse_config(_with_aggregator(address="198.18.0.9:7443", insecure=True), "t.toml")
    assert config.aggregator.insecure and config.aggregator.ca == ""
    assert config.aggregator.spool_max_events == 100_000 and config.aggregator.host_id == ""


@pytest.mark.parametrize("keys,key,reason", [
    (dict(insecure=True), "aggregator.address", "missing required key"),
    (dict(address="agg.example", insecure=True), "aggregator.address", "not HOST:PORT"),
    (dict(address="agg.example:0", insecure=True), "aggregator.address", "port in 1..65535"),
    (dict(address="agg example:7443", insecure=True), "aggregator.address",
     "neither a host name nor an IPv4 address"),
    (dict(address="[fd00::zz]:7443", insecure=True), "aggregator.address", "not an IPv6 address"),
    (dict(address="unix:agg.sock", insecure=True), "aggregator.address", "absolute path"),
    (dict(address="a:1", insecure=True, spool_max_events=99), "aggregator.spool_max_events",
     "outside 100..10000000"),
    (dict(address="a:1", insecure=True, spool_max_events=10_000_001),
     "aggregator.spool_max_events", "outside 100..10000000"),
    (dict(address="a:1", insecure=True, host_id="bad host"), "aggregator.host_id",
     "not a host name"),
    (dict(address="a:1", insecure=True, ca="relative/ca.pem"), "aggregator.ca",
     "not an absolute path"),
    (dict(address="a:1"), "aggregator.ca", "mutual TLS needs ca, cert and key"),
    (dict(address="a:1", insecure=True, extra=1), "aggregator.extra", "unknown key"),
])
def test_a_bad_aggregator_section_is_one_precise_line(keys, key, reason):
    with pytest.raises(ConfigError) as info:
        parse_config(_with_aggregator(**keys), "t.toml")
    assert info.value.key == key and reason in info.value.reason, str(info.value)


def test_tls_files_must_exist_and_be_readable(tmp_path):
    files = _tls_files(tmp_path)
    missing = dict(files, key=str(tmp_path / "nope.pem"))
    with pytest.raises(ConfigError) as info:
        parse_config(_with_aggregator(address="a:1", **missing), "t.toml")
    assert info.value.key == "aggregator.key" and "nope.pem" in info.value.reason
    assert "No such file" in info.value.reason
    with pytest.raises(ConfigError) as info:
        parse_config(_with_aggregator(address="a:1", **dict(files, ca=str(tmp_path))), "t.toml")
    assert info.value.key == "aggregator.ca" and "cannot read" in info.value.reason


def test_insecure_together_with_tls_files_is_refused(tmp_path):
    files = _tls_files(tmp_path)
    with pytest.raises(ConfigError) as info:
        parse_config(_with_aggregator(address="a:1", insecure=True, cert=files["cert"]), "t.toml")
    assert info.value.key == "aggregator.cert" and "insecure" in info.value.reason


def test_rails_say_their_gpus_and_leaf():
    config = parse_config(MINIMAL_RAIL + 'gpus = 8\nleaf = "leaf-a07"\n', "t.toml")
    assert (config.rails[0].gpus, config.rails[0].leaf) == (8, "leaf-a07")
    plain = parse_config(MINIMAL_RAIL, "t.toml").rails[0]
    assert (plain.gpus, plain.leaf) == (1, "")
    for bad, key in (("gpus = -1", "rail[0].gpus"), ('leaf = "leaf a"', "rail[0].leaf"),
                     ('gpus = "8"', "rail[0].gpus")):
        with pytest.raises(ConfigError) as info:
            parse_config(MINIMAL_RAIL + bad + "\n", "t.toml")
        assert info.value.key == key


def test_the_reference_says_the_aggregator_section_is_optional():
    doc = render_reference_markdown()
    section = doc.split("## `[aggregator]`")[1].split("## ")[0]
    assert "without a `[aggregator]` section the feature is off" in section
    assert "| `spool_max_events` |" in section
    assert "| `address` | string or array of strings |" in section
