"""The bgp fabric (labs/topos/bgpfabric.py) with linkpassd announcing: a
silent blackhole of lph1's rail 0 (the link stays up, both BGP speakers keep
their session until BFD ends it on the leaf) brings the flow *into* lph1's
rail-0 address back during the fault, because linkpassd moves the address's
announcement to rail 1 and the leaves and the spine learn it; and once the
fault clears, the address goes home (settling first, docs/bgp.md) and the
fabric forgets the detour.

Bounds are generous (the fault lasts 3 s, the recovery takes ~0.2 s here);
timing belongs to the demo and the benches.
"""

from __future__ import annotations

import json

import pytest

from labs.scenario import REVERSE, SENDER, ScenarioLab
from labs.topos.lab import lab_named_netns, root_lab_interfaces

pytestmark = pytest.mark.lab

FAULT_S = 3.0
RECOVERED_WITHIN_S = 1.5  # of the fault's 3 s
HOME_WITHIN_S = 30.0  # after the clear: echo rise, hold-down, settle, BGP


@pytest.fixture(scope="module")
def scenario():
    with ScenarioLab("linkpassd") as lab:
        yield lab


def bgp_route(lab, node: str, address: str) -> dict | None:
    routes = json.loads(lab.run(node, ["ip", "-j", "route", "show", "proto", "bgp",
                                       address]).stdout or "[]")
    return routes[0] if routes else None


def test_the_fabric_learns_only_subnets_while_healthy(scenario):
    lab = scenario.lab
    scenario.wait_recovered()
    for leaf in lab.leaves:
        for host in lab.hosts:
            for rail in host.rails:
                assert bgp_route(lab, leaf, rail.address) is None, (leaf, rail.address)
    assert lab.plan.fabric == "bgp"
    # the leaves' static routes are gone: every route to the other rail is bgpd's
    other = lab.rail("lph1", 1)
    assert bgp_route(lab, "lpl0", other.subnet)["gateway"] == lab.plan.uplinks[0].spine_address


def test_a_silent_blackhole_moves_the_reverse_flow_and_the_route_comes_home(scenario):
    lab = scenario.lab
    seq = scenario.last_event_seq()
    trial = scenario.trial("silent-blackhole", before_s=0.8, fault_s=FAULT_S, after_s=3.0)
    rev = trial.flows[REVERSE]
    dark = rev.receiver["blackout"]
    summary = (f"{trial.description}: reverse blackout {rev.blackout_s:.3f}s "
               f"({dark}), injected {trial.injected_at:.3f}, cleared {trial.cleared_at:.3f}")
    assert rev.sent > 1000, summary
    # back during the fault, well before the clear, and it stays back
    assert dark["end_t"] < trial.cleared_at, summary
    assert rev.blackout_s < RECOVERED_WITHIN_S, summary
    # the daemon moved the announcement, then brought it home through settling
    scenario.wait_recovered(timeout=HOME_WITHIN_S)
    events = scenario.events_text(after=seq)
    rail0 = lab.rail(SENDER, trial.rail).address
    moves = [line for line in events.splitlines() if " announce " in line and rail0 in line]
    assert any("detoured" in line for line in moves), events
    assert [x for x in ("settling", "restored") if any(x in line for line in moves)] == \
        ["settling", "restored"], events
    # and the fabric forgot the detour: the owner leaf delivers over its own port
    leaf = lab.rail(SENDER, trial.rail).leaf
    assert bgp_route(lab, leaf, rail0) is None
    route = json.loads(lab.run(leaf, ["ip", "-j", "route", "get", rail0]).stdout)[0]
    assert route["dev"] == lab.rail(SENDER, trial.rail).leaf_port


def test_no_lab_namespace_link_or_process_is_left_behind():
    assert lab_named_netns() == []
    assert root_lab_interfaces() == []
