"""Switch-side BFD in the Mininet lab: FRR bfdd on every leaf, our BfdAgent in every host.

``Lab(bfd=...)`` runs zebra + bfdd in each leaf with a single-hop peer per host
port (100 ms x 3 here, through a profile); labs.bfdpeer runs the project's
BfdAgent inside each host (Mininet nodes have no namespace name, so it is a
process there, not an in-process agent). Both ends are checked independently:
our events on one side, FRR's ``show bfd peers json`` on the other.

Shows: every host-leaf session comes Up on both sides; a silent blackhole on
one host link takes exactly that session Down on both sides within the
detection time (plus slack) while no other session changes state on either side;
clearing it brings it back Up; teardown stops FRR by PID and removes its
directories (the lab's leak check raises otherwise). Passive leaves send
nothing until the host speaks first. Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from labs.bfdpeer import BfdPeerProcess
from labs.faults import SilentBlackhole
from labs.netnslib import wait_for_sync
from labs.topos.dualrail import dualrail
from labs.topos.lab import Lab
from labs.topos.plan import FabricPlan, LabError, bfd_options, linkpassd_toml

pytestmark = pytest.mark.lab

INTERVAL_MS, MULT = 100, 3
BFD = {"interval_ms": INTERVAL_MS, "detect_mult": MULT}
DETECT_S = MULT * INTERVAL_MS / 1000
SLACK_S = 0.5  # our event stamps: a 2-core VM running two FRRs and two agents
# FRR's side is seen by polling vtysh (tens of ms a call), so its bound is
# an upper bound on when FRR changed state, and gets more room.
FRR_SLACK_S = 1.0
UP_WITHIN_S = 10.0  # Down -> Up includes the 1 s slow start on both sides


def needs_lab() -> None:
    if os.geteuid() != 0 or shutil.which("mnexec") is None:
        pytest.skip("needs root and mnexec (apt-get install mininet)")
    if not Path("/usr/lib/frr/bfdd").exists():
        pytest.skip("needs FRR (apt-get install frr)")


def frr_view(lab: Lab) -> dict[tuple[str, int], dict]:
    """(host, rail) -> FRR's peer entry, from every leaf."""
    by_addr = {r.address: (h.name, r.index) for h in lab.hosts for r in h.rails}
    return {by_addr[p["peer"]]: p for leaf in lab.leaves for p in lab.bfd_peers(leaf)}


def frr_counters(lab: Lab) -> dict[tuple[str, int], dict]:
    """(host, rail) -> FRR's ``show bfd peers counters json`` entry."""
    by_addr = {r.address: (h.name, r.index) for h in lab.hosts for r in h.rails}
    out = {}
    for leaf in lab.leaves:
        for p in json.loads(lab.frr(leaf).vtysh("show bfd peers counters json")):
            out[by_addr[p["peer"]]] = p
    return out


def poll_frr(lab: Lab, host: str, rail: int, status: str, timeout: float) -> tuple[float, dict]:
    """When FRR (polled as fast as vtysh answers) first shows ``status``:
    the monotonic time right after the answer, an upper bound."""
    deadline = time.monotonic() + timeout
    while True:
        peer = lab.bfd_peer(host, rail)
        seen = time.monotonic()
        if peer and peer["status"] == status:
            return seen, peer
        if seen > deadline:
            raise AssertionError(f"FRR's peer {host} rail {rail} not {status} after "
                                 f"{timeout}s: {peer}")


# ---- pure: option checking and config emission ------------------------------------------


def test_bfd_option_is_checked_against_frr_ranges():
    assert bfd_options(None) is None
    assert bfd_options(BFD) == {**BFD, "passive": False}
    for bad in ({"interval_ms": 5, "detect_mult": 3}, {"interval_ms": 100, "detect_mult": 1},
                {"interval_ms": 100}, {"interval_ms": 100.0, "detect_mult": 3},
                {**BFD, "passive": "yes"}, {**BFD, "echo": True}, [100, 3]):
        with pytest.raises(LabError):
            bfd_options(bad)  # type: ignore[arg-type]
    with pytest.raises(LabError):
        Lab(FabricPlan(2, 2, 1), bfd={"interval_ms": 1, "detect_mult": 3})


def test_linkpassd_config_asks_for_bfd_only_with_the_option():
    host = FabricPlan(2, 2, 1).host("lph1")
    kw = {"control_socket": "/tmp/x.sock", "run_dir": "/tmp/x"}
    plain = linkpassd_toml(host, **kw)
    assert "bfd" not in plain  # labs without BFD are unchanged
    with_bfd = linkpassd_toml(host, **kw, bfd=BFD)
    assert with_bfd.count("bfd = true") == len(host.rails)
    assert f"[bfd]\ninterval_ms = {INTERVAL_MS}\ndetect_mult = {MULT}\n" in with_bfd
    assert "passive" not in with_bfd  # a leaf option, not the daemon's
    assert with_bfd.replace("bfd = true\n", "").replace(
        f"[bfd]\ninterval_ms = {INTERVAL_MS}\ndetect_mult = {MULT}\n", "") == plain


def test_linkpassd_accepts_the_bfd_config():
    from linkpassd.config import parse_config

    host = FabricPlan(2, 2, 1).host("lph1")
    config = parse_config(linkpassd_toml(host, control_socket="/tmp/x.sock", run_dir="/tmp/x",
                                         bfd=BFD))
    assert (config.bfd.interval_ms, config.bfd.detect_mult) == (INTERVAL_MS, MULT)
    assert [r.bfd for r in config.rails] == [True] * len(host.rails)
    plain = parse_config(linkpassd_toml(host, control_socket="/tmp/x.sock", run_dir="/tmp/x"))
    assert not any(r.bfd for r in plain.rails)


# ---- the lab -------------------------------------------------------------------------


def test_leaf_frr_bfd_with_host_agents_and_a_silent_blackhole():
    needs_lab()
    report: dict = {}
    t_start = time.monotonic()
    with dualrail("none", bfd=BFD) as lab:
        report["build_s"] = round(time.monotonic() - t_start, 2)
        frr_procs = [p for leaf in lab.leaves for p in lab.frr(leaf).procs.values()]
        frr_dirs = [lab.frr(leaf).dir for leaf in lab.leaves]
        assert len(frr_procs) == 2 * len(lab.leaves)  # zebra + bfdd per leaf
        assert all(p.poll() is None for p in frr_procs)
        sessions = [(h.name, r.index) for h in lab.hosts for r in h.rails]
        try:
            # FRR as configured: one peer per host port, leaf half of the /31 as
            # local, the profile's timers; active, so Down (nothing answers yet).
            view = frr_view(lab)
            assert sorted(view) == sorted(sessions)
            for (host, r), peer in view.items():
                rail = lab.rail(host, r)
                assert (peer["local"], peer["interface"]) == (rail.gateway, rail.leaf_port)
                assert peer["multihop"] is False and peer["passive-mode"] is False
                assert peer["transmit-interval"] == peer["receive-interval"] == INTERVAL_MS
                assert peer["detect-multiplier"] == MULT and peer["status"] == "down"

            # 1. Every session Up, on both sides, and settled on 100 ms.
            agents = {h.name: BfdPeerProcess.start(lab, h.name) for h in lab.hosts}
            t_agents = time.monotonic()
            for host, r in sessions:
                agents[host].wait_state(f"rail{r}", "Up", UP_WITHIN_S)
            report["all_up_s"] = round(time.monotonic() - t_agents, 2)
            wait_for_sync(lambda: all(p["status"] == "up" and p["remote-transmit-interval"]
                                      == INTERVAL_MS and p["remote-receive-interval"]
                                      == INTERVAL_MS for p in frr_view(lab).values()),
                          5.0, "FRR: every peer up at 100 ms")
            time.sleep(0.5)  # both ends' poll sequences done: detection time 300 ms
            before = frr_counters(lab)
            marks = {h: a.mark() for h, a in agents.items()}

            # 2. Silent blackhole on lph1 rail 0: that session Down on both sides.
            fault = SilentBlackhole(lab, "lph1", 0)
            t_cut = fault.inject()
            t_frr_down, frr_down = poll_frr(lab, "lph1", 0, "down", DETECT_S + FRR_SLACK_S + 2)
            down = agents["lph1"].wait_state("rail0", "Down", DETECT_S + SLACK_S + 2,
                                             after=marks["lph1"])
            report["host_down_after_s"] = round(down["at"] - t_cut, 3)
            report["frr_down_seen_after_s"] = round(t_frr_down - t_cut, 3)
            assert down["diag_name"] == "control_detection_time_expired"
            assert down["detection_time_s"] == pytest.approx(DETECT_S)
            assert down["max_lag_s"] < DETECT_S  # a genuine silence, not our stall
            assert down["at"] - t_cut <= DETECT_S + SLACK_S
            assert t_frr_down - t_cut <= DETECT_S + FRR_SLACK_S
            assert frr_down["diagnostic"] == "control detection time expired"
            time.sleep(1.0)  # hold the fault: nothing else may move meanwhile
            during = frr_counters(lab)
            view = frr_view(lab)
            assert view[("lph1", 0)]["status"] == "down"
            for key in sessions:
                if key != ("lph1", 0):
                    assert view[key]["status"] == "up", (key, view[key])
                    assert during[key]["session-down"] == before[key]["session-down"], key
            assert during[("lph1", 0)]["session-down"] == before[("lph1", 0)]["session-down"] + 1
            assert [c["new"] for c in agents["lph1"].changes(marks["lph1"])] == ["Down"]
            assert agents["lph2"].changes(marks["lph2"]) == []
            counts = fault.counts()  # the fault really ate BFD both ways
            assert counts["host_to_leaf"]["dropped"] > 0 and counts["leaf_to_host"]["dropped"] > 0

            # 3. Clear: back Up on both sides; still nobody else moved.
            mark = agents["lph1"].mark()
            t_clear = fault.clear()
            up = agents["lph1"].wait_state("rail0", "Up", UP_WITHIN_S, after=mark)
            t_frr_up, _ = poll_frr(lab, "lph1", 0, "up", UP_WITHIN_S)
            report["host_up_after_clear_s"] = round(up["at"] - t_clear, 3)
            report["frr_up_seen_after_clear_s"] = round(t_frr_up - t_clear, 3)
            after = frr_counters(lab)
            assert all(p["status"] == "up" for p in frr_view(lab).values())
            for key in sessions:
                if key != ("lph1", 0):
                    assert after[key]["session-down"] == before[key]["session-down"], key
                    assert after[key]["session-up"] == before[key]["session-up"], key
            assert after[("lph1", 0)]["session-up"] == before[("lph1", 0)]["session-up"] + 1
            assert [c["new"] for c in agents["lph1"].changes(marks["lph1"])][-1] == "Up"
            assert agents["lph1"].changes(marks["lph1"], name="rail1") == []
            assert agents["lph2"].changes(marks["lph2"]) == []
        except BaseException:
            for leaf in lab.leaves:
                print(lab.frr(leaf).logs())
            raise
        t_down = time.monotonic()
    # Leaving the block ran the teardown and its leak check (LabLeakError otherwise).
    report["teardown_s"] = round(time.monotonic() - t_down, 2)
    assert all(p.poll() is not None for p in frr_procs)  # stopped by PID and reaped
    assert not any(d is not None and d.exists() for d in frr_dirs)
    report["total_s"] = round(time.monotonic() - t_start, 2)
    print("lab BFD:", report)


def test_passive_leaves_wait_for_the_host_to_speak():
    needs_lab()
    with dualrail("none", bfd={**BFD, "passive": True}) as lab:
        for peer in frr_view(lab).values():
            assert peer["passive-mode"] is True and peer["status"] == "down"
        time.sleep(1.2)  # over one slow-start interval: an active peer has sent by now
        assert all(c["control-packet-output"] == 0 for c in frr_counters(lab).values())
        agent = BfdPeerProcess.start(lab, "lph1", rails=[0])
        agent.wait_state("rail0", "Up", UP_WITHIN_S)
        poll_frr(lab, "lph1", 0, "up", 5.0)
        counters = frr_counters(lab)
        assert counters[("lph1", 0)]["control-packet-output"] > 0
        silent = [k for k, c in counters.items() if k != ("lph1", 0)]
        assert all(counters[k]["control-packet-output"] == 0 for k in silent)
        view = frr_view(lab)
        assert all(view[k]["status"] == "down" for k in silent)
