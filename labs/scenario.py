"""One fault, two flows, one measurement: shared by the demo, the failover
benchmark and the lab tests, so all three measure the same thing.

A trial on the dualrail lab sends two RoCEv2 flows from lph1 to lph2 at once:

  kernel-path  bound to lph1's address on the faulty rail, routed per packet
               (Soft-RoCE / TCP behaviour; a route change moves it at once);
  qp-pinned    egress port and next-hop MAC fixed at connect, re-resolved
               through the FIB after an ACK timeout (hardware QP behaviour).

The fault is put on the rail that the QP-pinned flow's connect-time route
lookup chose, so both flows cross it whatever the multipath hash picked. The
QP-pinned flow uses UDP 4792 so that both receivers can share lph2; it is sent
as raw frames, so no routing rule ever sees its port.

Blackout is the receiver's longest gap between arrivals. Each trial builds
nothing: a `ScenarioLab` holds one lab per mechanism and is reused, and
between trials it waits until the fabric has recovered and linkwatch has been
quiet (see labs/bench/carrier_failover.py for why that matters).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from labs.faults import (CablePull, Flap, Miswire, OneWayLoss, OpticDegradation, RandomLoss,
                         SilentBlackhole)
from labs.topos.dualrail import dualrail
from labs.topos.lab import Lab
from labs.topos.railopt import start_linkpassd
from labs.traffic.receiver import ReceiverConfig
from labs.traffic.sender import SenderConfig

MECHANISMS = ("none", "kernel", "linkpassd")
MODES = ("kernel-path", "qp-pinned")
PORTS = {"kernel-path": 4791, "qp-pinned": 4792}
QPS = {"kernel-path": (0x11, 0x12), "qp-pinned": (0x21, 0x22)}  # (sender, receiver)
SENDER, RECEIVER = "lph1", "lph2"

# Faster than production defaults so that a lab trial stays short; the
# hold-down is still longer than any flap in FAULTS.
LAB_TIMERS = {"rise": 2, "fall": 1, "hold_down_s": 1.5, "tick_interval_s": 0.1}

FaultFactory = Callable[[Lab, str, int], Any]
FAULTS: dict[str, FaultFactory] = {
    "cable-pull": lambda lab, host, rail: CablePull(lab, host, rail),
    "silent-blackhole": lambda lab, host, rail: SilentBlackhole(lab, host, rail),
    "one-way-loss": lambda lab, host, rail: OneWayLoss(lab, host, rail, direction="host_to_leaf"),
    "random-loss": lambda lab, host, rail: RandomLoss(lab, host, rail, percent=20),
    "flap": lambda lab, host, rail: Flap(lab, host, rail, times=3, within_s=1.5),
    "miswire": lambda lab, host, rail: Miswire(lab, host, rail, 1 - rail),
    "optic-degradation": lambda lab, host, rail: OpticDegradation(lab, host, rail, duration_s=1.5),
}
# What linkpassd moves traffic away from: carrier loss, failing sensors
# (optics, error counters), and, through BFD with the leaf, a path that dies
# while the link stays up (a silent blackhole, loss in one direction). A
# miswire swaps both of a host's cables: BFD sees both rails go down, but no
# healthy path is left to move to.
HANDLED_BY_LINKPASSD = ("cable-pull", "flap", "optic-degradation", "silent-blackhole",
                        "one-way-loss")
# With linkpassd the leaves run FRR bfdd and each host rail a BFD session with
# its leaf: 100 ms x 3, so 300 ms to detect.
LAB_BFD = {"interval_ms": 100, "detect_mult": 3}
# And each host rail echo-probes the other host's same rail, end to end,
# at the production default interval (a miss plus its burst: ~75 ms).
LAB_PROBES = {"interval_ms": 50}

LINKWATCH_QUIET_S = 1.2
READY_LINE = re.compile(r"sending t0=([0-9.]+)")


@dataclass
class FlowResult:
    mode: str
    blackout_s: float
    sent: int
    received: int
    lost: int
    reconnects: int
    receiver: dict = field(repr=False, default_factory=dict)
    sender: dict = field(repr=False, default_factory=dict)


@dataclass
class TrialResult:
    mechanism: str
    fault: str
    rail: int
    description: str
    injected_at: float
    cleared_at: float
    flows: dict[str, FlowResult]
    status_during: str = ""

    def as_dict(self) -> dict:
        return {"mechanism": self.mechanism, "fault": self.fault, "rail": self.rail,
                "description": self.description, "injected_at": self.injected_at,
                "cleared_at": self.cleared_at, "fault_s": self.cleared_at - self.injected_at,
                "flows": {m: {k: v for k, v in vars(f).items() if k not in ("receiver", "sender")}
                          for m, f in self.flows.items()}}


class ScenarioLab:
    """The dualrail lab with one host-routing mechanism, reused across trials."""

    def __init__(self, mechanism: str, *, rate: int = 1000):
        if mechanism not in MECHANISMS:
            raise ValueError(f"mechanism must be one of {', '.join(MECHANISMS)}, got {mechanism!r}")
        self.mechanism = mechanism
        self.rate = rate
        self.lab = dualrail(mechanism, linkpassd_timers=LAB_TIMERS,
                            bfd=LAB_BFD if mechanism == "linkpassd" else None,
                            probes=LAB_PROBES if mechanism == "linkpassd" else None)
        self.trials = 0

    def __enter__(self) -> "ScenarioLab":
        self.lab.start()
        try:
            if self.mechanism == "linkpassd":
                for host in (SENDER, RECEIVER):
                    start_linkpassd(self.lab, host)
        except BaseException:
            self.lab.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.lab.close()

    # ------------------------------------------------------------------ status

    def linkpassctl(self, host: str = SENDER, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "linkpassd.ctl.main", "--socket",
                               self.lab.control_socket(host), "--timeout", "3", *args],
                              capture_output=True, text=True, timeout=15)

    def status_text(self, host: str = SENDER) -> str:
        if self.mechanism != "linkpassd":
            return ""
        proc = self.linkpassctl(host, "status")
        return proc.stdout if proc.returncode == 0 else f"linkpassctl failed: {proc.stderr.strip()}"

    def _recovered(self) -> bool:
        """Every rail carries carrier again, linkpassd (if any) is back on its
        primary paths, and every rail forwards again: after a miswire or a
        flap the neighbour tables take a second or more to re-resolve (the
        first ARP after carrier returns is lost), and a trial started before
        that would measure the last fault, not its own."""
        for host in (SENDER, RECEIVER):
            for rail in self.lab.host(host).rails:
                if not self.lab.carrier(host, rail.port):
                    return False
        tx, rx = self.lab.host(SENDER), self.lab.host(RECEIVER)
        for rail in tx.rails:
            if not self.lab.ping(SENDER, rx.rail(rail.index).address, src_addr=rail.address,
                                 wait_s=0.5).ok:
                return False
        if self.mechanism == "linkpassd":
            for host in (SENDER, RECEIVER):
                proc = self.linkpassctl(host, "status", "-o", "json")
                if proc.returncode != 0:
                    return False
                st = json.loads(proc.stdout)
                if any(r["active_rail"] != r["name"] for r in st["rails"]):
                    return False
        return True

    def wait_recovered(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not self._recovered():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.mechanism}: lab did not recover within {timeout}s\n"
                                   f"{self.status_text()}")
            time.sleep(0.1)

    # ------------------------------------------------------------------ trials

    def qp_path_rail(self, dst: str) -> int:
        """The rail lph1's FIB picks for dst with no source: where a
        reconnecting QP (rdma_cm without a bound source) would go."""
        out = self.lab.run(SENDER, ["ip", "-j", "route", "get", dst]).stdout
        dev = json.loads(out)[0]["dev"]
        return next(r.index for r in self.lab.host(SENDER).rails if r.port == dev)

    def trial(self, fault: str, *, before_s: float = 1.0, fault_s: float = 2.0,
              after_s: float = 1.5) -> TrialResult:
        if fault not in FAULTS:
            raise ValueError(f"fault must be one of {', '.join(FAULTS)}, got {fault!r}")
        lab = self.lab
        self.wait_recovered()
        time.sleep(LINKWATCH_QUIET_S)
        tx, rx = lab.host(SENDER), lab.host(RECEIVER)
        qp_dst = rx.rail(0).address
        rail = self.qp_path_rail(qp_dst)
        dst = {"kernel-path": rx.rail(rail).address, "qp-pinned": qp_dst}
        duration = before_s + fault_s + after_s
        work = lab.host_dir(SENDER) / f"trial{self.trials}-{fault}"
        work.mkdir(parents=True, exist_ok=True)
        self.trials += 1

        receivers = {}
        for mode in MODES:
            cfg = ReceiverConfig(bind=dst[mode], port=PORTS[mode], duration=duration + 5,
                                 qp=QPS[mode][1], peer_qp=QPS[mode][0]).validated()
            receivers[mode] = self._start(RECEIVER, cfg.command(str(work / f"rx-{mode}.json")),
                                          work / f"rx-{mode}.log", "ready")
        senders = {}
        for mode in MODES:
            cfg = SenderConfig(mode=mode, dst=dst[mode], rate=self.rate, duration=duration,
                               port=PORTS[mode], qp=QPS[mode][0], dst_qp=QPS[mode][1],
                               src=tx.rail(rail).address if mode == "kernel-path" else None)
            senders[mode] = self._start(SENDER, cfg.validated().command(str(work / f"tx-{mode}.json")),
                                        work / f"tx-{mode}.log", "sending t0=")
        t0 = max(self._t0(work / f"tx-{mode}.log") for mode in MODES)

        injector = FAULTS[fault](lab, SENDER, rail)
        _sleep_until(t0 + before_s)
        injected = injector.inject()
        _sleep_until(injected + fault_s * 0.8)
        during = self.status_text()
        _sleep_until(injected + fault_s)
        cleared = injector.clear()

        flows = {}
        for mode in MODES:
            _wait(senders[mode], duration + 10, f"{mode} sender")
            _wait(receivers[mode], 15, f"{mode} receiver")
            rx_report = json.loads((work / f"rx-{mode}.json").read_text())
            tx_report = json.loads((work / f"tx-{mode}.json").read_text())
            flows[mode] = FlowResult(mode=mode, blackout_s=rx_report["blackout"]["gap_s"],
                                     sent=rx_report["sent"], received=rx_report["unique"],
                                     lost=rx_report["lost"],
                                     reconnects=len(tx_report.get("qp_pinned", {})
                                                    .get("reconnects", [])),
                                     receiver=rx_report, sender=tx_report)
        return TrialResult(mechanism=self.mechanism, fault=fault, rail=rail,
                           description=injector.description, injected_at=injected,
                           cleared_at=cleared or injected, flows=flows, status_during=during)

    def _start(self, host: str, argv: list[str], log: Path, ready: str) -> subprocess.Popen:
        with open(log, "wb") as out:
            proc = self.lab.popen(host, argv, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 15
        while ready not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{' '.join(argv[:4])} in {host} did not start:\n"
                                   f"{log.read_text(errors='replace')}")
            time.sleep(0.02)
        return proc

    @staticmethod
    def _t0(log: Path) -> float:
        match = READY_LINE.search(log.read_text(errors="replace"))
        assert match, f"no 'sending t0=' in {log}"
        return float(match.group(1))


def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _wait(proc: subprocess.Popen, timeout: float, what: str) -> None:
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{what} still running after {timeout}s") from None
    if code != 0:
        raise RuntimeError(f"{what} exited with {code}")
