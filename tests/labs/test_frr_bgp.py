"""The frr-bgp baseline in the Mininet lab: FRR's eBGP + BFD per rail moves a
host's fabric route off a rail that goes silent, and back once it heals.

One dualrail lab per BFD timer setting (300 ms x 3, and 50 ms x 3) is shared
by the tests of that setting. Witnesses are independent of the mechanism:
the host kernel's own answer to ``route get`` (labs.routewatch, stamped with
time.monotonic() like the fault), ``ip -j route`` in the host, and FRR's
``show bgp neighbors json`` / ``show bfd peers json`` on both ends. Every
wait is bounded; each fault test starts from a settled lab (wait_frr_bgp)
and leaves one. Teardown stops bgpd, bfdd and zebra of every node by PID
(the lab's leak check raises otherwise), checked in the fixture.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from labs.faults import OneWayLoss, SilentBlackhole
from labs.routewatch import RouteWatch
from labs.topos.dualrail import dualrail
from labs.topos.frrbgp import host_asn, leaf_asn, rail_local_pref
from labs.topos.lab import Lab
from labs.topos.plan import HOST_SPACE

pytestmark = pytest.mark.lab

H1, H2 = "lph1", "lph2"
MOVE_WITHIN_S = 5.0  # detection (0.9 s at 300 ms x 3) + bgpd + zebra, with room
BACK_WITHIN_S = 15.0  # BFD slow start, BGP connect retry (1 s), OPEN, UPDATE, install
SETTLE_S = 20.0


def needs_lab() -> None:
    if os.geteuid() != 0 or shutil.which("mnexec") is None:
        pytest.skip("needs root and mnexec (apt-get install mininet)")
    if not Path("/usr/lib/frr/bgpd").exists():
        pytest.skip("needs FRR (apt-get install frr)")


@pytest.fixture(scope="module", params=[300, 50], ids=lambda ms: f"bfd{ms}ms")
def lab(request):
    needs_lab()
    interval = request.param
    with dualrail("frr-bgp", bfd={"interval_ms": interval, "detect_mult": 3}) as lab:
        procs = [p for node in (*lab.leaves, H1, H2) for p in lab.frr(node).procs.values()]
        dirs = [lab.frr(node).dir for node in (*lab.leaves, H1, H2)]
        yield lab
    # Leaving the block ran teardown and its leak check (LabLeakError otherwise).
    assert all(p.poll() is not None for p in procs)  # bgpd, bfdd, zebra: stopped and reaped
    assert not any(d is not None and d.exists() for d in dirs)


def earliest_detection_s(lab: Lab) -> float:
    """BFD declares a path down detect_mult intervals after the last packet
    it heard, which left at most one interval before the fault: a move
    sooner than this was not BFD's doing."""
    assert lab.bfd is not None
    return (lab.bfd["detect_mult"] - 1) * lab.bfd["interval_ms"] / 1000


def test_every_node_runs_frr_with_bgp(lab):
    for node in (*lab.leaves, H1, H2):
        assert sorted(lab.frr(node).procs) == ["bfdd", "bgpd", "zebra"]
        assert all(p.poll() is None for p in lab.frr(node).procs.values())


def test_hosts_route_the_fabric_via_rail_zero_from_bgp(lab):
    for host in lab.hosts:
        rail0 = host.rail(0)
        routes = lab.fabric_routes(host)
        assert len(routes) == 1, routes
        (route,) = routes
        assert (route["gateway"], route["dev"], route["protocol"]) == \
            (rail0.gateway, rail0.port, "bgp")
        assert "nhid" in route  # zebra installs through nexthop objects
        # No per-rail source rules in this mechanism: local, main, default only.
        rules = lab.run(host, ["ip", "-j", "rule", "show"]).stdout
        assert [r["table"] for r in json.loads(rules)] == ["local", "main", "default"]
        # Both rails' paths known, rail 0 preferred, each from its leaf's AS.
        neighbors = lab.frr(host).bgp_neighbors()
        for rail in host.rails:
            info = neighbors[rail.gateway]
            assert info["bgpState"] == "Established"
            assert info["remoteAs"] == leaf_asn(rail.index)
            assert info["localAs"] == host_asn(host.index)
        paths = json.loads(lab.frr(host).vtysh(
            f"show bgp ipv4 unicast {HOST_SPACE} json"))["paths"]
        prefs = {p["nexthops"][0]["ip"]: p["locPrf"] for p in paths}
        assert prefs == {r.gateway: rail_local_pref(r.index) for r in host.rails}
        best = [p for p in paths if p.get("bestpath", {}).get("overall")]
        assert [p["nexthops"][0]["ip"] for p in best] == [rail0.gateway]


def test_leaves_forward_as_planned_and_learn_nothing(lab):
    for r, leaf in enumerate(lab.leaves):
        routes = json.loads(lab.run(leaf, ["ip", "-j", "route", "show",
                                                         "table", "all"]).stdout)
        assert not [x for x in routes if x.get("protocol") == "bgp"], routes
        received = json.loads(lab.frr(leaf).vtysh(
            "show bgp ipv4 unicast json"))["routes"]
        assert list(received) == [HOST_SPACE]  # its own announcement only
        for host in lab.hosts:
            peer = lab.bfd_peer(host, r)
            assert peer is not None and peer["status"] == "up"
            assert peer["transmit-interval"] == lab.bfd["interval_ms"]
    ok = lab.reachability(count=1, wait_s=1.0)
    assert all(row["ok"] for row in ok), ok


def failover_and_back(lab: Lab, fault, report: dict) -> None:
    """Inject ``fault`` on lph1 rail 0 and clear it, watching where lph1's
    kernel sends lph2's rail-0 address."""
    lab.wait_frr_bgp(SETTLE_S)
    h1 = lab.host(H1)
    rail0, rail1 = h1.rail(0), h1.rail(1)
    watch = RouteWatch.start(lab, H1, lab.rail(H2, 0).address, duration_s=60.0)
    assert (watch.initial.oif, watch.initial.gateway) == (rail0.port, rail0.gateway)
    try:
        mark = watch.mark()
        t_inject = fault.inject()
        moved = watch.wait_change(lambda c: c.oif != rail0.port, MOVE_WITHIN_S,
                                  f"route off {rail0.port}", after=mark)
        report["moved_after_s"] = round(moved.at - t_inject, 3)
        assert moved.at >= t_inject, "the route moved before the fault"
        assert moved.at - t_inject >= earliest_detection_s(lab), report
        assert watch.changes(mark)[0] == moved  # nothing moved in between
        assert (moved.oif, moved.gateway) == (rail1.port, rail1.gateway)
        # The route follows BGP: rail 0's session is down, rail 1's still up.
        states = lab.frr(H1).bgp_states()
        assert states[rail0.gateway] != "Established" and states[rail1.gateway] == "Established"
        (route,) = lab.fabric_routes(H1)
        assert (route["gateway"], route["dev"]) == (rail1.gateway, rail1.port)
        # lph2 is untouched: still via its own rail 0.
        assert [r["dev"] for r in lab.fabric_routes(H2)] == [lab.rail(H2, 0).port]

        time.sleep(1.0)  # hold the fault: the route must stay off rail 0
        held = watch.changes(mark)
        assert held == [moved], held
        mark = watch.mark()
        t_clear = fault.clear()
        back = watch.wait_oif(rail0.port, BACK_WITHIN_S, after=mark)
        report["back_after_clear_s"] = round(back.at - t_clear, 3)
        assert back.at >= t_clear and back.gateway == rail0.gateway
        report["settled_after_back_s"] = round(lab.wait_frr_bgp(SETTLE_S), 3)
    except BaseException:
        for node in (H1, rail0.leaf):
            print(f"=== FRR in {node}\n{lab.frr(node).logs()}")
        print(f"=== routewatch lines: {watch.lines.events}")
        raise
    finally:
        fault.clear()
        stopped = watch.stop()
    assert stopped is not None and stopped["reason"] == "signal"
    print(f"frr-bgp {lab.bfd['interval_ms']} ms x {lab.bfd['detect_mult']}:", report)


def test_silent_blackhole_moves_the_route_to_rail_one_and_back(lab):
    fault = SilentBlackhole(lab, H1, 0)
    report = {"fault": fault.kind}
    failover_and_back(lab, fault, report)
    counts = fault.counts()
    assert counts["host_to_leaf"]["dropped"] > 0 and counts["leaf_to_host"]["dropped"] > 0


def test_one_way_loss_host_to_leaf_moves_the_route(lab):
    """Only the host's frames die. The leaf's BFD expires first; the host
    hears of it anyway (the leaf's BGP NOTIFICATION and BFD Down reach it),
    so the host's route moves too."""
    fault = OneWayLoss(lab, H1, 0, "host_to_leaf")
    report = {"fault": f"{fault.kind} host_to_leaf"}
    failover_and_back(lab, fault, report)
    counts = fault.counts()
    assert counts["host_to_leaf"]["dropped"] > 0
