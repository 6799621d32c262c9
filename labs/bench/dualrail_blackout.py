"""Blackout of a 1 packet/ms kernel-path flow across a silent blackhole, linkpassd
echo at 10 ms against FRR eBGP + BFD 10 ms x 3, on the same dualrail lab
(labs/bench/probing.py's two mechanisms): the comparison part of
labs/bench/probe_scale (`--part blackout-frr`).

The flow goes from lph1's rail-0 address to lph2's rail-0 address (the
receiver there reports its longest gap between arrivals). The fault is
SilentBlackhole on lph1's rail 0 (the leaf port drops both ways, carrier up).
FRR has no per-rail source rules, so after its failover the flow leaves on
rail 1 with its rail-0 source and reaches lph2 through the spine, as
linkpassd's does: the same packets on the same path for both.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from labs.bench.probing import probes_up, wait
from labs.faults import SilentBlackhole
from labs.routewatch import RouteWatch
from labs.scenario import LAB_TIMERS
from labs.topos.dualrail import dualrail
from labs.topos.lab import Lab
from labs.topos.railopt import start_linkpassd
from labs.traffic.receiver import ReceiverConfig
from labs.traffic.sender import SenderConfig

INTERVAL_MS = 10
DETECT_MULT = 3
RATE_PPS = 1000
BEFORE_S, FAULT_S, AFTER_S = 0.8, 0.8, 0.4
RECOVER_TIMEOUT_S = 30.0
HOSTS = ("lph1", "lph2")


def make_lab(mechanism: str) -> Lab:
    if mechanism == "linkpassd":
        return dualrail("linkpassd", linkpassd_timers=LAB_TIMERS,
                        probes={"interval_ms": INTERVAL_MS})
    return dualrail("frr-bgp", bfd={"interval_ms": INTERVAL_MS, "detect_mult": DETECT_MULT})


def _start(lab: Lab, host: str, argv: list[str], log: Path, ready: str) -> subprocess.Popen:
    with open(log, "wb") as out:
        proc = lab.popen(host, argv, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 15
    while ready not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{argv[:3]} in {host} not {ready!r}: {log.read_text()[-2000:]}")
        time.sleep(0.02)
    return proc


def fault_gap(report: dict, injected: float) -> dict:
    """The receiver's gap that spans the fault's injection: the blackout the
    fault caused. The longest gap of the run can be another one (a sender
    descheduled on this busy 2-core machine); without a spanning gap, the
    longest."""
    for gap in report.get("top_gaps") or []:
        if gap.get("start_t") is not None and gap["start_t"] <= injected + 0.002 < gap["end_t"]:
            return gap
    return report["blackout"]


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.monotonic()))


def run(mechanism: str, trials: int, rng, log=print) -> list[dict]:
    rows = []
    with make_lab(mechanism) as lab:
        if mechanism == "linkpassd":
            for host in HOSTS:
                start_linkpassd(lab, host)
        h1, h2 = lab.host("lph1"), lab.host("lph2")
        rail0, dst = h1.rail(0), h2.rail(0).address
        watch = RouteWatch.start(lab, "lph1", dst, src=rail0.address, duration_s=3600)
        try:
            for trial in range(trials):
                wait(lambda: (watch.current() or watch.initial).oif == rail0.port,
                     RECOVER_TIMEOUT_S, f"{mechanism}: route back on {rail0.port}")
                if mechanism == "linkpassd":
                    wait(lambda: probes_up(lab), RECOVER_TIMEOUT_S, "echo probes up")
                else:
                    lab.wait_frr_bgp()
                time.sleep(0.5)
                work = lab.host_dir("lph1") / f"blackout{trial}"
                work.mkdir(parents=True, exist_ok=True)
                duration = BEFORE_S + FAULT_S + AFTER_S
                rx_cfg = ReceiverConfig(bind=dst, duration=duration + 5).validated()
                rx = _start(lab, "lph2", rx_cfg.command(str(work / "rx.json")), work / "rx.log",
                            "ready")
                tx_cfg = SenderConfig(mode="kernel-path", dst=dst, src=rail0.address,
                                      rate=RATE_PPS, duration=duration).validated()
                tx = _start(lab, "lph1", tx_cfg.command(str(work / "tx.json")), work / "tx.log",
                            "sending t0=")
                t0 = float((work / "tx.log").read_text().split("t0=")[1].split()[0])
                fault = SilentBlackhole(lab, "lph1", 0)
                _sleep_until(t0 + BEFORE_S + rng.uniform(0, INTERVAL_MS / 1000))
                injected = fault.inject()
                try:
                    _sleep_until(injected + FAULT_S)
                finally:
                    fault.clear()
                tx.wait(duration + 10)
                rx.wait(15)
                report = json.loads((work / "rx.json").read_text())
                gap = fault_gap(report, injected)
                ms = gap["gap_s"] * 1e3
                rows.append({"mechanism": mechanism, "interval_ms": INTERVAL_MS, "trial": trial,
                             "blackout_ms": ms, "lost": report.get("lost"),
                             "longest_gap_ms": report["blackout"]["gap_s"] * 1e3,
                             "gap_start_after_inject_ms": (gap["start_t"] - injected) * 1e3
                             if gap.get("start_t") is not None else None})
                log(f"blackout-frr {mechanism:<9} #{trial:<3} {ms:7.1f} ms "
                    f"(lost {report.get('lost')} of {report.get('sent')})")
        finally:
            watch.stop()
    return rows
