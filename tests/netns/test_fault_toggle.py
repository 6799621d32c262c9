"""Pre-installed faults toggle drop/pause exactly when told (issue 25, item 5).

On a dualrail lab (mechanism ``none``: static routes, nothing moves), a
fault is armed first (nft chains / the tbf qdisc installed, matching
nothing), then injected and cleared twice while a 1 packet/ms flow crosses
the faulted leaf port. The receiver's gaps must start and end at the
injection and clearing stamps, give or take one packet spacing plus the
scheduling of a Python sender and receiver on this 2-core machine
(SLACK_S); a drop loses the packets of its window and nothing else, a pause
loses nothing. Injecting and clearing must start no process (no nft, no tc):
subprocess.Popen is made to fail while they run.
"""

from __future__ import annotations

import os
import shutil
import time
from unittest import mock

import pytest

from labs.faults import LeafPause, SilentBlackhole
from labs.faults.nft import TABLE
from labs.faults.pause import HANDLE
from labs.labflow import LabFlow, gap_spanning
from labs.topos.dualrail import dualrail

pytestmark = pytest.mark.netns

H1, H2 = "lph1", "lph2"
PERIOD_S = 0.001  # the flow's packet spacing
SLACK_S = 0.004
CYCLES = ((0.4, 0.100), (0.9, 0.040))  # (after the flow's t0, fault length) in seconds
FLOW_S = 1.5


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    if os.geteuid() != 0 or shutil.which("mnexec") is None:
        pytest.skip("needs root and mnexec (apt-get install mininet)")
    with dualrail("none") as lab:
        lab.ping(H1, lab.rail(H2, 0).address, src_addr=lab.rail(H1, 0).address)  # fresh ARP
        yield lab


def _no_process(*args, **kwargs):
    raise AssertionError(f"a process was started at fault time: {args[:1]}")


def run_cycles(lab, fault, src_host, dst_host, workdir):
    flow = LabFlow(lab, src_host, lab.rail(src_host, 0).address, dst_host,
                   lab.rail(dst_host, 0).address, duration=FLOW_S, workdir=workdir)
    t0 = flow.start()
    stamps = []
    try:
        for offset, length in CYCLES:
            time.sleep(max(0.0, t0 + offset - time.monotonic()))
            with mock.patch("subprocess.Popen", side_effect=_no_process):
                fault.inject()
                time.sleep(max(0.0, fault.injected_at + length - time.monotonic()))
                fault.clear()
            stamps.append(fault.stamps())
    finally:
        fault.clear()
    return flow.report(), stamps


def _tbf_rate(lab, port):
    out = lab.run("lpl0", ["tc", "qdisc", "show", "dev", port]).stdout
    return out


@pytest.mark.timeout(60)
def test_armed_blackhole_drops_exactly_while_injected(lab, tmp_path):
    fault = SilentBlackhole(lab, H1, 0).arm()
    try:
        assert ("netdev", TABLE) in lab.nft_tables("lpl0")  # installed before the trial
        report, stamps = run_cycles(lab, fault, H1, H2, tmp_path)
        assert ("netdev", TABLE) in lab.nft_tables("lpl0")  # and still there: one toggle each
        dropped = fault.counts()["host_to_leaf"]["dropped"]
    finally:
        fault.disarm()
    assert ("netdev", TABLE) not in lab.nft_tables("lpl0")
    expected_lost = 0
    for s in stamps:
        assert s["injected_at"] < s["inject_acked_at"] < s["cleared_at"] < s["clear_acked_at"]
        gap = gap_spanning(report, s["injected_at"], slack_s=SLACK_S)
        assert gap is not None, (s, report["top_gaps"])
        # the silence begins at the injection and ends at the clearing
        assert s["injected_at"] - PERIOD_S - SLACK_S <= gap["start_t"] <= s["inject_acked_at"] \
            + SLACK_S, (s, gap)
        assert s["cleared_at"] <= gap["end_t"] <= s["clear_acked_at"] + PERIOD_S + SLACK_S, (s, gap)
        expected_lost += (s["cleared_at"] - s["injected_at"]) / PERIOD_S
    # every lost packet was one the rule dropped, and about as many as the windows hold
    assert report["lost"] == dropped, (report["lost"], dropped)
    assert abs(report["lost"] - expected_lost) <= len(stamps) * (2 + SLACK_S / PERIOD_S), \
        (report["lost"], expected_lost)


@pytest.mark.timeout(60)
def test_armed_pause_holds_exactly_while_injected_and_loses_nothing(lab, tmp_path):
    port = lab.rail(H1, 0).leaf_port
    fault = LeafPause(lab, H1, 0).arm()
    try:
        assert f"tbf {HANDLE >> 16:x}:" in _tbf_rate(lab, port)  # installed, open
        report, stamps = run_cycles(lab, fault, H2, H1, tmp_path)  # lpl0 -> lph1 is paused
        assert "rate 10Gbit" in _tbf_rate(lab, port)  # open again, still installed
    finally:
        fault.disarm()
    assert "tbf" not in _tbf_rate(lab, port)
    assert report["lost"] == 0, report
    for s, (_, length) in zip(stamps, CYCLES):
        assert s["injected_at"] < s["inject_acked_at"] < s["cleared_at"] < s["clear_acked_at"]
        # the bucket still holds 256 bytes when the pause begins: a frame or two pass
        gap = gap_spanning(report, s["injected_at"], slack_s=3 * PERIOD_S + SLACK_S)
        assert gap is not None, (s, report["top_gaps"])
        assert s["injected_at"] - PERIOD_S - SLACK_S <= gap["start_t"], (s, gap)
        # what queued leaves at once when the pause ends
        assert s["cleared_at"] <= gap["end_t"] <= s["clear_acked_at"] + SLACK_S, (s, gap)
        assert gap["gap_s"] >= length - 3 * PERIOD_S - SLACK_S, (gap, length)
