"""Explain: a port's verdict and every routing consequence of it."""

from corefixtures import port, ports, rails_config
from linkpassd.core import explain, policy
from linkpassd.core.model import Verdict


def consequences(cfg, states, name):
    d = policy.decide(cfg, states)
    return explain.explain(cfg, d, states, name)


def test_healthy_port_carries_its_table_and_the_group():
    cfg = rails_config(2)
    e = consequences(cfg, ports(cfg), "eth0")
    assert [(c.kind, c.name, c.role, c.carries_port) for c in e.consequences] == [
        ("rail-table", "rail0", "primary", True),
        ("rail-table", "rail1", "backup 1", False),
        ("group", "fabric", "member", True)]
    assert e.summary.startswith("eth0 (rail0) is UP and carries rail0 (primary), fabric")


def test_drained_port_names_where_its_traffic_went():
    cfg = rails_config(3)
    states = ports(cfg, eth0=port("eth0", Verdict.DEGRADED))
    states["eth0"] = states["eth0"].__class__(**{**vars(states["eth0"]),
                                                 "evidence": ("optics: lane 0 RX -11 dBm",)})
    e = consequences(cfg, states, "eth0")
    primary = e.consequences[0]
    assert not primary.carries_port and "through rail1 (eth1) instead" in primary.detail
    group = e.consequences[-1]
    assert not group.carries_port and "members now rail1, rail2" in group.detail
    assert "is DEGRADED (optics: lane 0 RX -11 dBm); it carries no traffic" in e.summary


def test_backup_role_and_capacity_floor_are_explained():
    cfg = rails_config(2, min_paths=2)
    states = ports(cfg, eth0=port("eth0", Verdict.DOWN), eth1=port("eth1", Verdict.DEGRADED))
    e = consequences(cfg, states, "eth1")
    backup = next(c for c in e.consequences if c.role == "backup 1")
    assert backup.name == "rail0" and backup.carries_port
    group = e.consequences[-1]
    assert group.carries_port and "capacity floor min_paths=2" in group.detail


def test_unknown_port_is_none():
    cfg = rails_config(2)
    assert consequences(cfg, ports(cfg), "eth9") is None
