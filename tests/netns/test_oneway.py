"""One-way delay against the real kernel and the real responder (issue 31,
item 2). The lab's namespaces share one kernel, so one clock: with
`clock = "shared"` on both ends the bound is 0 and the delays each way are
reported; without a bound at either end they are refused, saying why.

This kernel has no netem, so no test here makes one direction slower than
the other; which way a delay is put is tested with simulated replies
(tests/unit/test_oneway_core.py). Here: the fields cross the real kernel both
ways (the batched responder's kernel receive stamps, the rail socket's
wall-clock stamps), the delays are small and never negative, and they add
up to the round trip.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from labs.daemonproc import assessment
from labs.echopeer import NETNS_PEER, EchoPeerProcess
from labs.netnslib import run, wait_for_sync
from linkpassd.adapters.clocksync import read_clock
from linkpassd.adapters.echo import EchoService, ProbePath
from linkpassd.adapters.echoresponder import EchoResponder
from linkpassd.core.admission import ResponderPolicy
from linkpassd.core.oneway import NOT_CONFIGURED, SHARED, ClockReading, describe
from linkpassd.core.probe import ProbeConfig

pytestmark = pytest.mark.netns

CONFIG = ProbeConfig(interval_s=0.010)
LAB_POLICY = ResponderPolicy.build(None, ["198.18.0.0/15"])
RUN_S = 1.5


async def probe_with(lab, ours: ClockReading, theirs: ClockReading):
    """Probe the leaf from rail 0 for RUN_S, our clock reading `ours`, the
    responder's `theirs`; the path's prober and its assessment."""
    rail = lab.rails[0]
    responder = EchoResponder(netns=lab.leaf.name, policy=LAB_POLICY)
    responder.set_clock(theirs)
    service = EchoService([ProbePath(rail.port, rail.address, rail.gateway)], CONFIG,
                          respond=False, netns=lab.host.name, clock=ours)
    try:
        responder.start()
        service.start()
        await asyncio.sleep(RUN_S)
        (prober,) = service.probers.values()
        return prober, prober.assessment()
    finally:
        service.close()
        responder.close()


def test_shared_clocks_give_one_way_delays_with_bound_zero(lab):
    prober, a = run(probe_with(lab, SHARED, SHARED), timeout=30)
    d = a.one_way
    assert d is not None and d.refused == "", d
    assert d.bound_s == 0 and d.clocks == "shared" and d.samples >= 50
    ow = prober.state.oneway
    assert ow.marked == prober.state.counters.received + prober.state.counters.late
    # Each way: the kernel's own veth crossing, well under a millisecond, and never
    # negative (the requests carry our wall clock, the replies the leaf's kernel stamp).
    assert 0 <= d.towards_s < 1e-3 and 0 <= d.back_s < 1e-3, d
    assert min(ow.forward) >= 0 and min(ow.back) >= 0
    # Together they are the round trip (the peer's hold left out), sample by
    # sample, taken in wall-clock time from our kernel's stamp. The prober's own
    # figure (loop time) is never longer; it is shorter by whatever ran between
    # the wake-up's loop-time and wall-clock reads: microseconds, on a busy
    # machine more, never near a probe interval.
    rtt_s = prober.state.rtt_s
    assert rtt_s is not None
    gap_ns = ow.forward[-1] + ow.back[-1] - rtt_s * 1e9
    assert -2_000 < gap_ns < CONFIG.interval_s * 1e9, gap_ns  # ns: -2 us, float rounding
    words = f"one-way delay towards {lab.rails[0].gateway} "
    assert describe(d, lab.rails[0].gateway).startswith(words)
    assert describe(d, lab.rails[0].gateway).endswith("±0 us (clocks: shared)")


@pytest.mark.parametrize("ours, theirs, why", [
    (NOT_CONFIGURED, SHARED, 'not used for one-way delay ([probes] clock = "none")'),
    (SHARED, NOT_CONFIGURED, "the peer's clock is not synchronised (its responder reports no "
                             "error bound)"),
])
def test_without_a_bound_at_either_end_one_way_delay_is_refused(lab, ours, theirs, why):
    prober, a = run(probe_with(lab, ours, theirs), timeout=30)
    assert prober.state.counters.received >= 50  # the round trips go on
    assert a.one_way is not None and a.one_way.towards_s is None
    assert why in a.one_way.refused, a.one_way


def test_auto_on_this_host_refuses_and_names_what_it_asked(lab):
    """This machine runs neither chronyd nor ptp4l: "auto" finds no bound."""
    ours = run(read_clock("auto"), timeout=30)
    if ours.bound_ns is not None:
        pytest.skip(f"this host's clock has a bound ({ours.source})")
    _prober, a = run(probe_with(lab, ours, SHARED), timeout=30)
    assert a.one_way.refused.startswith(
        "this host's clock reports no synchronisation (no chronyd answered "
        "`chronyc -c tracking`"), a.one_way.refused
    assert "no ptp4l answered pmc" in a.one_way.refused


def explain(daemon, port: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "linkpassd.ctl.main", "--socket",
                           daemon.socket_path, "--timeout", "5", "explain", port],
                          capture_output=True, text=True, timeout=20)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def path_of(status: dict | None, port: str) -> dict:
    return assessment(status, port, f"probe:{NETNS_PEER}")


async def probe_the_daemon(lab):
    """From the leaf, probe the daemon's rail 0 address (its responder
    process answers) for RUN_S with a shared clock: the path's assessment."""
    rail = lab.rails[0]
    service = EchoService([ProbePath(rail.peer, rail.gateway, rail.address)], CONFIG,
                          respond=False, netns=lab.leaf.name, clock=SHARED)
    try:
        service.start()
        await asyncio.sleep(RUN_S)
        (prober,) = service.probers.values()
        assert prober.state.counters.received >= 50, prober.state.counters
        return prober.assessment()
    finally:
        service.close()


@pytest.mark.parametrize("clock", ["shared", "none"])
def test_the_daemon_reports_them_in_explain_and_status(lab, echo_daemon, clock):
    """linkpassd itself, its responder process and a lab peer (labs.echopeer)
    sharing this kernel's clock: `explain` names the one-way delays per path
    and the status JSON carries them; with clock = "none" both say why not.
    The daemon's responder process sends its bound (0, or none) to probers
    that ask."""
    daemon = echo_daemon(interval_ms=20, clock=clock)
    port = lab.rails[0].port
    with EchoPeerProcess(lab.leaf.name, duration=60, clock="shared"):
        wait_for_sync(lambda: path_of(daemon.status(), port).get("status") == "ok", 10.0,
                      "the path is up")
        if clock == "shared":
            wait_for_sync(lambda: (path_of(daemon.status(), port).get("one_way") or {})
                          .get("towards_s") is not None, 10.0, "one-way delays reported")
            one_way = path_of(daemon.status(), port)["one_way"]
            assert one_way["bound_s"] == 0 and one_way["clocks"] == "shared"
            assert 0 <= one_way["towards_s"] < 1e-3 and 0 <= one_way["back_s"] < 1e-3
            assert one_way["refused"] == "" and one_way["samples"] >= 10
            text = explain(daemon, port)
            assert f"{NETNS_PEER}: one-way delay towards {NETNS_PEER} " in text, text
            assert "±0 us (clocks: shared)" in text, text
            theirs = run(probe_the_daemon(lab), timeout=30).one_way
            assert theirs.refused == "" and theirs.bound_s == 0, theirs
        else:
            time.sleep(1.0)  # 50 replies: had they carried a bound, they would say so
            one_way = path_of(daemon.status(), port)["one_way"]
            assert one_way["towards_s"] is None
            assert '[probes] clock = "none"' in one_way["refused"]
            text = explain(daemon, port)
            assert (f"{NETNS_PEER}: one-way delay not reported: this host's clock is not used "
                    "for one-way delay") in text, text
            theirs = run(probe_the_daemon(lab), timeout=30).one_way
            assert "the peer's clock is not synchronised" in theirs.refused, theirs
