"""core.announce: which rail address is announced on which rail, driven by the
policy's decisions (and, end to end, by the health state machine with
simulated time, so the hold-down of routes is the hold-down of announcements)."""

from dataclasses import replace

from corefixtures import port, ports, rails_config
from linkpassd.core import announce, health, policy
from linkpassd.core.announce import Change, Role
from linkpassd.core.events import Severity
from linkpassd.core.model import AnnounceSettings, LinkSample, Timers, Verdict

ON = AnnounceSettings(enabled=True, metric_base=1000)


def plan(cfg, states, settings=ON):
    return announce.plan(cfg, settings, policy.decide(cfg, states).rails)


def where(p):
    return {a: (x.via, str(x.role), x.metric) for a, x in p.items()}


def test_off_by_default_announces_nothing():
    cfg = rails_config(2)
    assert announce.plan(cfg, AnnounceSettings(), policy.decide(cfg, ports(cfg)).rails) == {}


def test_healthy_rails_announce_their_own_address_on_their_own_rail():
    cfg = rails_config(3)
    assert where(plan(cfg, ports(cfg))) == {
        "198.18.0.1": ("rail0", "owner", 1000),
        "198.18.1.1": ("rail1", "owner", 1001),
        "198.18.2.1": ("rail2", "owner", 1002)}


def test_failed_rail_address_moves_to_the_rail_carrying_its_traffic():
    cfg = rails_config(3)
    p = plan(cfg, ports(cfg, eth0=port("eth0", Verdict.DOWN)))
    assert where(p)["198.18.0.1"] == ("rail1", "detour", 1001)  # first backup, like the route
    assert where(p)["198.18.1.1"] == ("rail1", "owner", 1001)
    # a gray failure: carrier up, verdict not trusted -> still moved off its own session
    p = plan(cfg, ports(cfg, eth0=port("eth0", Verdict.DEGRADED, carrier=True)))
    assert p["198.18.0.1"].via == "rail1" and p["198.18.0.1"].role is Role.DETOUR


def test_detour_skips_an_unhealthy_backup_and_no_path_means_not_announced():
    cfg = rails_config(3)
    p = plan(cfg, ports(cfg, eth0=port("eth0", Verdict.DOWN), eth1=port("eth1", Verdict.DOWN)))
    assert p["198.18.0.1"].via == "rail2" and p["198.18.1.1"].via == "rail2"
    p = plan(cfg, {r.port: port(r.port, Verdict.DOWN) for r in cfg.rails})
    assert p == {}


def test_rail_without_backups_stays_on_its_own_rail():
    cfg = rails_config(2, backups="none")
    p = plan(cfg, ports(cfg, eth0=port("eth0", Verdict.DEGRADED)))
    assert p["198.18.0.1"].via == "rail0" and p["198.18.0.1"].role is Role.OWNER


def test_only_configured_addresses_are_planned_and_foreign_ones_are_named():
    cfg = rails_config(2)
    addresses = set(plan(cfg, ports(cfg)))
    assert addresses == {r.address for r in cfg.rails}
    held = ["198.18.0.1", "10.9.9.9"]  # rail1's address is not on the host
    assert announce.foreign(["198.18.0.1", "198.18.1.1", "10.9.9.9"], cfg, held) == \
        ["10.9.9.9", "198.18.1.1"]
    assert announce.foreign(addresses, cfg, [r.address for r in cfg.rails]) == []


def test_transitions_table_names_every_change():
    cfg = rails_config(3)
    healthy = plan(cfg, ports(cfg))
    failed = plan(cfg, ports(cfg, eth0=port("eth0", Verdict.DOWN)))
    moved = plan(cfg, ports(cfg, eth0=port("eth0", Verdict.DOWN), eth1=port("eth1", Verdict.DOWN)))
    (t,) = announce.transitions(healthy, failed)
    assert (t.address, t.change, t.severity) == ("198.18.0.1", Change.DETOURED, Severity.WARNING)
    assert "via rail1" in t.message and "was via rail0" in t.message
    changes = {x.address: x.change for x in announce.transitions(failed, moved)}
    assert changes == {"198.18.0.1": Change.DETOUR_MOVED, "198.18.1.1": Change.DETOURED}
    (t,) = announce.transitions(failed, healthy)
    assert t.change is Change.RESTORED and t.severity is Severity.INFO
    gone = announce.transitions(healthy, {})
    assert {x.change for x in gone} == {Change.WITHDRAWN} and len(gone) == 3
    assert {x.change for x in announce.transitions({}, healthy)} == {Change.ANNOUNCED}
    assert announce.transitions(healthy, dict(healthy)) == []


def test_every_transition_key_is_reachable_and_only_those():
    roles = [None, Role.OWNER, Role.DETOUR]
    for a in roles:
        for b in roles:
            if a is None and b is None or a is b is Role.OWNER:
                continue
            assert (a, b) in announce.TRANSITIONS
    # settling only follows a detour, and ends on its own rail, in a detour or nowhere
    settling = {k for k in announce.TRANSITIONS if Role.SETTLING in k}
    assert settling == {(Role.DETOUR, Role.SETTLING), (Role.SETTLING, Role.OWNER),
                        (Role.SETTLING, Role.DETOUR), (Role.SETTLING, None)}


def test_a_detour_settles_with_no_export_over_its_rail_before_going_home():
    """Own rail trusted again: the address stays on the detour rail's session
    (the settling metric, which FRR sends with NO_EXPORT) for settle_s, then
    goes home; a new failure while settling detours it again at once."""
    cfg = rails_config(3)
    settings = replace(ON, settle_s=1.0)
    healthy = ports(cfg)
    failed = ports(cfg, eth0=port("eth0", Verdict.DOWN))

    def at(states, previous, now):
        return announce.plan(cfg, settings, policy.decide(cfg, states).rails, previous, now)

    detoured = at(failed, {}, 10.0)
    back = at(healthy, detoured, 20.0)
    a = back["198.18.0.1"]
    assert (a.via, a.role, a.metric, a.until) == ("rail1", Role.SETTLING, 1000 + 3 + 1, 21.0)
    assert announce.settle_metric_of(cfg, settings, "rail1") == 1004
    (t,) = announce.transitions(detoured, back)
    assert t.change is Change.SETTLING and t.severity is Severity.INFO
    assert at(healthy, back, 20.9) == back  # still settling, same deadline
    home = at(healthy, back, 21.0)
    assert where(home)["198.18.0.1"] == ("rail0", "owner", 1000)
    (t,) = announce.transitions(back, home)
    assert t.change is Change.RESTORED
    again = at(failed, back, 20.5)
    assert where(again)["198.18.0.1"] == ("rail1", "detour", 1001)
    assert announce.transitions(back, again)[0].change is Change.DETOURED
    # no previous plan (a restart) or settle_s = 0: straight home
    assert where(at(healthy, {}, 20.0))["198.18.0.1"] == ("rail0", "owner", 1000)
    assert announce.plan(cfg, replace(settings, settle_s=0.0), policy.decide(cfg, healthy).rails,
                         detoured, 20.0)["198.18.0.1"].role is Role.OWNER


def _sample(port_name, carrier, downs):
    return LinkSample(port=port_name, present=True, ifindex=2, admin_up=True, carrier=carrier,
                      operstate="UP" if carrier else "LOWERLAYERDOWN",
                      carrier_up_count=downs + (1 if carrier else 0), carrier_down_count=downs)


def test_back_on_its_own_rail_only_after_the_routes_hold_down():
    """Simulated time through core.health: the address comes home exactly
    when the rail table does, never before."""
    timers = Timers(rise=2, fall=1, hold_down_s=5.0)
    cfg = replace(rails_config(2), timers=timers)
    hs = {r.port: health.initial(_sample(r.port, True, 0), 0.0) for r in cfg.rails}

    def step(now, eth0_carrier, downs):
        hs["eth0"] = health.observe(hs["eth0"], _sample("eth0", eth0_carrier, downs), now, timers)
        hs["eth1"] = health.observe(hs["eth1"], _sample("eth1", True, 0), now, timers)
        states = {p: health.port_state(h, now, timers) for p, h in hs.items()}
        d = policy.decide(cfg, states)
        return d.rails[0].active_rail, announce.plan(cfg, ON, d.rails)["198.18.0.1"]

    route, ann = step(1.0, True, 0)
    assert route == "rail0" and ann.role is Role.OWNER
    route, ann = step(2.0, False, 1)  # cable pull
    assert route == "rail1" and (ann.via, ann.role) == ("rail1", Role.DETOUR)
    now, seen = 2.5, []
    while now < 12.0:  # carrier back at 2.5: hold-down, rise
        route, ann = step(now, True, 1)
        assert ann.via == route  # the announcement follows the route, every step
        seen.append((now, ann.role))
        now += 0.5
    home = next(t for t, role in seen if role is Role.OWNER)
    assert home >= 2.5 + timers.hold_down_s
    assert seen[-1][1] is Role.OWNER
