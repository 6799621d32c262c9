"""frr-bgp on the bgp fabric (labs/topos/frrbgp.fabric_host_bgpd): FRR alone,
on the hosts and the switches, moves both directions off a silent rail, and
back. The failover bench's baseline (labs/bench/failover.py); its own lab,
so it never shares node names with test_frr_bgp's static-fabric labs
(whose needs_lab and host names it uses).
"""

from __future__ import annotations

import json
import time

import pytest
from test_frr_bgp import H1, H2, needs_lab

from labs.faults import SilentBlackhole
from labs.topos.dualrail import dualrail
from labs.topos.frrbgp import CONDITION_TIMER_S
from labs.topos.lab import Lab

pytestmark = pytest.mark.lab


DETOUR_WITHIN_S = 0.9 + CONDITION_TIMER_S + 3.0  # BFD + bgpd's condition scan + the fabric
UNDETOUR_WITHIN_S = 30.0  # BFD slow start, connect retry, OPEN, the next scan, the fabric


def leaf_route(lab: Lab, leaf: str, address: str) -> dict:
    return json.loads(lab.run(leaf, ["ip", "-j", "route", "get", address]).stdout)[0]


def test_on_the_bgp_fabric_a_silent_blackhole_detours_the_address_and_ends():
    """frr-bgp on the bgp fabric (labs/topos/frrbgp.fabric_host_bgpd): a
    silent blackhole of lph1's rail 0 ends its BFD session; lph1's FRR then
    announces the rail-0 address over rail 1 (its conditional advertisement),
    and rail 0's own leaf routes it up to the spine. Once the fault clears,
    the session comes back over the link (the leaf binds it to its port, so
    the detour /32 does not carry it), the condition turns, the detour is
    withdrawn and the leaf delivers over its port again."""
    needs_lab()
    with dualrail("frr-bgp", bfd={"interval_ms": 100, "detect_mult": 3}, fabric="bgp") as lab:
        h1 = lab.host(H1)
        a0, leaf0 = h1.rail(0).address, h1.rail(0).leaf
        assert leaf_route(lab, leaf0, a0)["dev"] == h1.rail(0).leaf_port
        fault = SilentBlackhole(lab, H1, 0)
        injected = fault.inject()
        try:
            deadline = injected + DETOUR_WITHIN_S
            while (route := leaf_route(lab, leaf0, a0))["dev"] == h1.rail(0).leaf_port:
                assert time.monotonic() < deadline, (
                    f"{leaf0} still delivers {a0} over its port {DETOUR_WITHIN_S:g} s into the "
                    f"blackhole:\n{lab.frr(H1).vtysh('show bgp ipv4 unicast')}")
                time.sleep(0.1)
            assert route.get("gateway", "").startswith("198.19."), route  # up to the spine
            assert lab.ping(H2, a0, src_addr=lab.host(H2).rail(0).address, wait_s=1.0).ok
        finally:
            fault.clear()
        took = lab.wait_frr_bgp(UNDETOUR_WITHIN_S)  # nothing detoured, every session up
        assert leaf_route(lab, leaf0, a0)["dev"] == h1.rail(0).leaf_port, took
