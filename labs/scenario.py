"""One fault, four flows, one measurement: shared by the demo, the failover
benchmark and the lab tests, so all three measure the same thing.

A trial on the dualrail lab sends four RoCEv2 flows at once, two of them
from lph1 (the host whose link is faulted) to lph2:

  kernel-path  bound to lph1's address on the faulty rail, routed per packet
               (Soft-RoCE / TCP behaviour; a route change moves it at once);
  qp-pinned    egress port and next-hop MAC fixed at connect, re-resolved
               through the FIB after an ACK timeout (hardware QP behaviour);

and two the other way, from lph2 into the faulted host, addressed to
lph1's address on the faulty rail:

  kernel-path-reverse  kernel-path, bound to lph2's address on the same rail;
  qp-pinned-reverse    qp-pinned: lph2's egress and next hop fixed at connect.

Both keep arriving over the broken link until the fabric learns another way
to lph1's address: the lab is the bgp fabric (labs/topos/bgpfabric.py), and
with linkpassd lph1's FRR announces the address through a healthy rail once
linkpassd distrusts the faulted one (docs/bgp.md); with ``frr-bgp`` lph1's
FRR does so by itself once BFD ended the rail's session (a conditional
advertisement, labs/topos/frrbgp.py); with neither nothing announces it
(DESIGN.md, "Both directions of a gray failure"). lph2's own path to the
leaf stays healthy, so the pinned reverse flow needs no reconnect: it
recovers when the fabric moves.

The fault is put on the rail that the QP-pinned flow's connect-time route
lookup chose, so every flow crosses it whatever the multipath hash picked. The
QP-pinned flows use UDP 4792 so that two receivers can share each host's
address; they are sent as raw frames, so no routing rule ever sees their port.

Blackout is the receiver's longest gap between arrivals. Each trial builds
nothing: a `ScenarioLab` holds one lab per mechanism and is reused. Before
each trial it waits until the fabric has recovered and linkwatch has been
quiet (see labs/bench/carrier_failover.py for why that matters), then
asserts that every rail of both hosts is healthy and on its own path, naming
what is not: a trial that starts from the last trial's state measures that.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from labs.faults import CablePull, Flap, Miswire, OneWayLoss, OpticDegradation, RandomLoss, SilentBlackhole
from labs.topos.dualrail import dualrail
from labs.topos.lab import Lab
from labs.topos.plan import with_section_options
from labs.topos.railopt import start_linkpassd
from labs.traffic.receiver import ReceiverConfig
from labs.traffic.sender import SenderConfig

MECHANISMS = ("none", "kernel", "linkpassd", "frr-bgp")
MODES = ("kernel-path", "qp-pinned")  # the flows from the faulted host, by sender mode
REVERSE = "kernel-path-reverse"  # into the faulted host, on its faulted rail's address
REVERSE_QP = "qp-pinned-reverse"  # the same, from a pinned queue pair
REVERSES = (REVERSE, REVERSE_QP)
FLOWS = MODES + REVERSES
PORTS = {"kernel-path": 4791, "qp-pinned": 4792, REVERSE: 4791, REVERSE_QP: 4792}
QPS = {"kernel-path": (0x11, 0x12), "qp-pinned": (0x21, 0x22),
       REVERSE: (0x31, 0x32), REVERSE_QP: (0x41, 0x42)}  # (sender, receiver)
SENDER, RECEIVER = "lph1", "lph2"

# Faster than production defaults so that a lab trial stays short; the
# hold-down is still longer than any flap in FAULTS.
LAB_TIMERS = {"rise": 2, "fall": 1, "hold_down_s": 1.5, "tick_interval_s": 0.1}

FaultFactory = Callable[[Lab, str, int], Any]
FAULTS: dict[str, FaultFactory] = {
    "cable-pull": lambda lab, host, rail: CablePull(lab, host, rail),
    "silent-blackhole": lambda lab, host, rail: SilentBlackhole(lab, host, rail),
    "one-way-loss-out": lambda lab, host, rail: OneWayLoss(lab, host, rail,
                                                           direction="host_to_leaf"),
    "one-way-loss-in": lambda lab, host, rail: OneWayLoss(lab, host, rail,
                                                          direction="leaf_to_host"),
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
                        "one-way-loss-out", "one-way-loss-in")
# With linkpassd (and frr-bgp, the hosts' own bfdd) each host rail runs a BFD
# session with its leaf: 100 ms x 3, so 300 ms to detect.
LAB_BFD = {"interval_ms": 100, "detect_mult": 3}
# And each host rail echo-probes the other host's same rail, end to end,
# at the production defaults (50 ms interval, 30 ms tolerance: docs/probing.md).
LAB_PROBES = {"interval_ms": 50}

# A stand-in for the rest of a fleet's hosts on rail r (ScenarioLab(stand_in=)):
# an echo responder on rail r's leaf, on an address of the rail's host space
# that no host of a lab this size uses (host 127's gateway).
STAND_IN_PEER = "198.18.{rail}.254"
STAND_IN_S = 3 * 3600  # its bound: longer than any bench run, stopped with the lab

LINKWATCH_QUIET_S = 1.2
READY_LINE = re.compile(r"sending t0=([0-9.]+)")
# When in the fault (a fraction of fault_s) linkpassd's view is taken: after
# the optic ramp (1.5 s of a 3 s trial) crossed its alarm, with time to spare
# before the clear for two linkpassctl runs on a busy machine.
SNAPSHOT_AT = 0.55


class LabNotHealthy(AssertionError):
    """A trial would not start from a healthy lab: the message names the
    host, the rail and why (verdict, phase, evidence, path)."""


@dataclass
class FlowResult:
    mode: str  # the flow, one of FLOWS
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
    nccl_env_during: str = ""
    # CLOCK_MONOTONIC at each step of the trial runner: a step that ran long
    # (a slow linkpassctl call) delays the clear, and the report must show it
    steps: dict[str, float] = field(default_factory=dict)
    # with [fence] on: the fences each host's linkpassd made during the trial
    fences: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"mechanism": self.mechanism, "fault": self.fault, "rail": self.rail,
                "description": self.description, "injected_at": self.injected_at,
                "cleared_at": self.cleared_at, "fault_s": self.cleared_at - self.injected_at,
                "fences": self.fences,
                "flows": {m: {k: v for k, v in vars(f).items() if k not in ("receiver", "sender")}
                          for m, f in self.flows.items()}}


class ScenarioLab:
    """The dualrail lab with one host-routing mechanism, reused across trials."""

    def __init__(self, mechanism: str, *, rate: int = 1000, aggregator: bool = False,
                 fabric: str = "bgp", fence: dict | None = None, stand_in: bool = False):
        """`aggregator`: (linkpassd only) both daemons report to a lab
        aggregator (`self.lab.aggregator`), which also hands out their probe
        peers (no probe_peers in the configs). `fabric`: ``bgp`` (leaves and
        spine learn host routes; the hosts announce them with linkpassd or
        frr-bgp) or ``static`` (the old lab with its carrier-only detour).
        `fence`: (linkpassd only) options of linkpassd's ``[fence]`` section,
        written into both daemons' configs (``enabled`` is set). `stand_in`:
        (linkpassd only) every rail also echo-probes a stand-in peer behind its
        leaf (STAND_IN_PEER), so that one host's failure is the other host's
        "trouble only towards that peer", not a rail of its own gone (with
        two hosts, each rail has no other peer: one dead host fails the other
        host's healthy rail over, which in a fleet it would not)."""
        if mechanism not in MECHANISMS:
            raise ValueError(f"mechanism must be one of {', '.join(MECHANISMS)}, got {mechanism!r}")
        if aggregator and mechanism != "linkpassd":
            raise ValueError("an aggregator needs the linkpassd mechanism")
        if fence is not None and mechanism != "linkpassd":
            raise ValueError("fencing is linkpassd's: fence= needs the linkpassd mechanism")
        if stand_in and (mechanism != "linkpassd" or aggregator):
            raise ValueError("stand-in peers are linkpassd's configured echo peers: stand_in= "
                             "needs the linkpassd mechanism without the aggregator's mesh")
        self.mechanism = mechanism
        self.rate = rate
        self.fence = {"enabled": True, **fence} if fence is not None else None
        self.lab = dualrail(mechanism, linkpassd_timers=LAB_TIMERS,
                            bfd=LAB_BFD if mechanism in ("linkpassd", "frr-bgp") else None,
                            probes=LAB_PROBES if mechanism == "linkpassd" else None,
                            aggregator=aggregator, mesh=aggregator, fabric=fabric)
        self.fabric = fabric
        self.stand_in = stand_in
        if stand_in:
            self.lab.extra_echo_peers = {r: [STAND_IN_PEER.format(rail=r)]
                                         for r in range(self.lab.plan.n_rails)}
        self.trials = 0

    def __enter__(self) -> "ScenarioLab":
        self.lab.start()
        try:
            if self.stand_in:
                self._start_stand_ins()
            if self.mechanism == "linkpassd":
                for host in (SENDER, RECEIVER):
                    if self.fence is not None:
                        path = self.lab.config_path(host)
                        path.write_text(with_section_options(path.read_text(), "fence",
                                                             self.fence))
                    start_linkpassd(self.lab, host)
        except BaseException:
            self.lab.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.lab.close()

    def _start_stand_ins(self) -> None:
        """On each rail's leaf: the stand-in peer's address on its loopback
        and an echo responder answering on it (stopped with the lab)."""
        for r in range(self.lab.plan.n_rails):
            leaf = self.lab.rail(SENDER, r).leaf
            address = STAND_IN_PEER.format(rail=r)
            self.lab.run(leaf, ["ip", "address", "add", f"{address}/32", "dev", "lo"])
            log = self.lab.host_dir(SENDER) / f"stand-in-{leaf}.log"
            with log.open("w") as out:
                self.lab.popen(leaf, [sys.executable, "-m", "labs.echopeer", "--duration",
                                      str(STAND_IN_S), "--address", address],
                               stdout=out, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + 15
            while '"ready"' not in log.read_text():
                if time.monotonic() > deadline:
                    raise LabNotHealthy(f"stand-in peer {address} on {leaf} did not start: "
                                        + log.read_text()[-500:])
                time.sleep(0.1)

    # ------------------------------------------------------------------ status

    def linkpassctl(self, host: str = SENDER, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "linkpassd.ctl.main", "--socket",
                               self.lab.control_socket(host), "--timeout", "3", *args],
                              capture_output=True, text=True, timeout=15)

    def status_text(self, host: str = SENDER) -> str:
        if self.mechanism != "linkpassd":
            return ""
        return self._ctl_text(host, "status")

    def _ctl_text(self, host: str, *args: str) -> str:
        proc = self.linkpassctl(host, *args)
        return proc.stdout if proc.returncode == 0 else \
            f"linkpassctl {args[0]} failed ({proc.returncode}): {proc.stderr.strip()}"

    def nccl_env_text(self, host: str = SENDER) -> str:
        """What a launcher on `host` would put in NCCL's environment now."""
        if self.mechanism != "linkpassd":
            return ""
        return self._ctl_text(host, "nccl-env", "--file",
                              str(self.lab.run_dir(host) / "health.json"))

    def fence_counts(self) -> dict[str, int]:
        """Fences each host's linkpassd made since it started ({} unless
        fencing is on)."""
        if self.fence is None:
            return {}
        out = {}
        for host in (SENDER, RECEIVER):
            proc = self.linkpassctl(host, "fences", "-o", "json")
            if proc.returncode != 0:
                raise RuntimeError(f"linkpassctl fences on {host}: {proc.stderr.strip()}")
            out[host] = sum(int(f.get("fences", 0)) for f in json.loads(proc.stdout)["fences"])
        return out

    def last_event_seq(self, host: str = SENDER) -> int:
        proc = self.linkpassctl(host, "status", "-o", "json")
        return int(json.loads(proc.stdout)["last_event_seq"]) if proc.returncode == 0 else 0

    def events_text(self, host: str = SENDER, after: int = 0, limit: int = 0) -> str:
        """`linkpassctl events` on `host`: what linkpassd decided after event
        `after` (at most `limit` events; 0: all held)."""
        if self.mechanism != "linkpassd":
            return ""
        limit_args = ("--limit", str(limit)) if limit > 0 else ()  # the CLI takes N >= 1
        return self._ctl_text(host, "events", "--after", str(after), *limit_args)

    def unhealthy(self) -> list[str]:
        """What keeps the lab from a healthy start, one line per problem
        naming the host and rail ([] when there is none): every rail has
        carrier and forwards again (after a miswire or a flap the neighbour
        tables take a second or more to re-resolve: the first ARP after
        carrier returns is lost), and with linkpassd every port's verdict and
        health phase are UP and every rail is routed on its own path, as both
        the daemon and the kernel see it."""
        problems = []
        for host in (SENDER, RECEIVER):
            for rail in self.lab.host(host).rails:
                if not self.lab.carrier(host, rail.port):
                    problems.append(f"{host} rail{rail.index} ({rail.port}): no carrier")
        if problems:
            return problems
        tx, rx = self.lab.host(SENDER), self.lab.host(RECEIVER)
        for rail in tx.rails:
            peer = rx.rail(rail.index).address
            if not self.lab.ping(SENDER, peer, src_addr=rail.address, wait_s=0.5).ok:
                problems.append(f"{SENDER} rail{rail.index}: no reply from {peer} "
                                f"(from {rail.address})")
        if self.mechanism == "linkpassd":
            for host, peer in ((SENDER, rx), (RECEIVER, tx)):
                problems += self._linkpassd_unhealthy(host, peer)
        if self.mechanism == "frr-bgp":
            problems += self.lab.frr_bgp_missing()
        elif self.fabric == "bgp":
            problems += self.lab.fabric_missing(bfd=self.mechanism == "linkpassd")
        return problems

    def _linkpassd_unhealthy(self, host: str, peer) -> list[str]:
        proc = self.linkpassctl(host, "status", "-o", "json")
        if proc.returncode != 0:
            return [f"{host}: linkpassctl status failed: {proc.stderr.strip()}"]
        st = json.loads(proc.stdout)
        rail_of = {r.get("port"): r.get("name") for r in st.get("rails", [])}
        seen = {port.get("port") for port in st.get("ports", [])}
        problems = [f"{host} rail{rail.index} ({rail.port}): no verdict yet"
                    for rail in self.lab.host(host).rails if rail.port not in seen]
        for port in st.get("ports", []):
            verdict, phase = port.get("verdict", "?"), port.get("phase", "?")
            if verdict != "VERDICT_UP" or phase != "UP":
                reason = "; ".join(port.get("evidence", [])) or "no evidence given"
                problems.append(f"{host} {rail_of.get(port.get('port'), '?')} ({port.get('port')}): "
                                f"verdict {verdict}, phase {phase}, reason: {reason}")
        for r in st.get("rails", []):
            if r.get("active_rail") != r.get("name"):
                problems.append(f"{host} {r.get('name')}: routed through "
                                f"{r.get('active_rail') or 'no path'}, not its own")
        for rail in self.lab.host(host).rails:
            dst = peer.rail(rail.index).address
            out = self.lab.run(host, ["ip", "-j", "route", "get", dst, "from", rail.address],
                               check=False).stdout
            dev = json.loads(out)[0].get("dev") if out.strip() else None
            if dev != rail.port:
                problems.append(f"{host} rail{rail.index}: the kernel routes {rail.address} -> "
                                f"{dst} through {dev or 'nothing'}, not {rail.port}")
        return problems

    def wait_recovered(self, timeout: float = 45.0) -> None:
        """Until the lab is healthy (see `unhealthy`); raises naming every
        host, rail and reason still wrong at the deadline. Generous: after a
        fault that silenced every path (a miswire) the echo loss window (200
        probes at 50 ms, clearing at 10 % loss) keeps the rails DEGRADED for
        about 10 s, then rise and hold-down; seen above 20 s on a busy machine."""
        deadline = time.monotonic() + timeout
        while problems := self.unhealthy():
            if time.monotonic() > deadline:
                raise LabNotHealthy(f"{self.mechanism}: lab not healthy within {timeout}s:\n  "
                                    + "\n  ".join(problems) + f"\n{self.status_text()}"
                                    + self._evidence())
            time.sleep(0.1)

    def _evidence(self) -> str:
        """What linkpassd on each host decided last (its latest events, and
        its fences when fencing is on), for a lab that did not come back."""
        if self.mechanism != "linkpassd":
            return ""
        out = []
        for host in (SENDER, RECEIVER):
            seq = self.last_event_seq(host)
            out.append(f"\nlatest events on {host}:\n"
                       + self.events_text(host, after=max(0, seq - 30)))
            if self.fence is not None:
                out.append(f"fences on {host}:\n" + self._ctl_text(host, "fences"))
        return "".join(out)

    def assert_healthy(self) -> None:
        """Right before a trial's traffic starts: healthy now, or fail loudly."""
        if problems := self.unhealthy():
            raise LabNotHealthy(f"{self.mechanism}: trial would start unhealthy:\n  "
                                + "\n  ".join(problems) + f"\n{self.status_text()}")

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
        self.assert_healthy()
        fences_before = self.fence_counts()
        tx, rx = lab.host(SENDER), lab.host(RECEIVER)
        qp_dst = rx.rail(0).address
        rail = self.qp_path_rail(qp_dst)
        # flow: (sending host, receiving host, destination, source to bind or None)
        ends = {"kernel-path": (SENDER, RECEIVER, rx.rail(rail).address, tx.rail(rail).address),
                "qp-pinned": (SENDER, RECEIVER, qp_dst, None),
                REVERSE: (RECEIVER, SENDER, tx.rail(rail).address, rx.rail(rail).address),
                REVERSE_QP: (RECEIVER, SENDER, tx.rail(rail).address, None)}
        duration = before_s + fault_s + after_s
        work = lab.host_dir(SENDER) / f"trial{self.trials}-{fault}"
        work.mkdir(parents=True, exist_ok=True)
        self.trials += 1

        # Every process is launched at once and waited for together: each one
        # takes its own time to import and connect (about a second on a busy
        # 2-core VM), and started one by one the first sender would run ahead
        # of the fault timeline and stop before the fault cleared.
        receivers = {}
        for flow in FLOWS:
            _, to_host, dst, _ = ends[flow]
            cfg = ReceiverConfig(bind=dst, port=PORTS[flow], duration=duration + 5,
                                 qp=QPS[flow][1], peer_qp=QPS[flow][0]).validated()
            receivers[flow] = self._launch(to_host, cfg.command(str(work / f"rx-{flow}.json")),
                                           work / f"rx-{flow}.log")
        self._await_marker(receivers, work, "rx", "ready")
        senders = {}
        for flow in FLOWS:
            from_host, _, dst, src = ends[flow]
            cfg = SenderConfig(mode="qp-pinned" if src is None else "kernel-path", dst=dst,
                               rate=self.rate, duration=duration, port=PORTS[flow],
                               qp=QPS[flow][0], dst_qp=QPS[flow][1], src=src, hold=True)
            senders[flow] = self._launch(from_host,
                                         cfg.validated().command(str(work / f"tx-{flow}.json")),
                                         work / f"tx-{flow}.log", stdin=subprocess.PIPE)
        self._await_marker(senders, work, "tx", "armed")
        for flow, sender in senders.items():  # --hold: all schedules start together
            sender.release(work / f"tx-{flow}.log")
        self._await_marker(senders, work, "tx", "sending t0=")
        started = {flow: self._t0(work / f"tx-{flow}.log") for flow in FLOWS}
        t0 = max(started.values())

        injector = FAULTS[fault](lab, SENDER, rail)
        steps = {f"t0 {flow}": at for flow, at in started.items()}
        _sleep_until(t0 + before_s)
        steps["inject_start"] = time.monotonic()
        injected = injector.inject()
        steps["inject_end"] = time.monotonic()
        # The snapshot of linkpassd's view during the fault runs beside the
        # timeline, never in it: two linkpassctl runs can take longer than
        # the time left, and a late clear would cut into after_s.
        _sleep_until(injected + fault_s * SNAPSHOT_AT)
        snapshot = Snapshot(self, steps)
        _sleep_until(injected + fault_s)
        steps["clear_start"] = time.monotonic()
        cleared = injector.clear()
        steps["clear_end"] = time.monotonic()
        during, nccl_during = snapshot.result()

        flows = {}
        for mode in FLOWS:
            _wait(senders[mode].proc, duration + 10, f"{mode} sender")
            _wait(receivers[mode].proc, 15, f"{mode} receiver")
            rx_report = json.loads((work / f"rx-{mode}.json").read_text())
            tx_report = json.loads((work / f"tx-{mode}.json").read_text())
            flows[mode] = FlowResult(mode=mode, blackout_s=rx_report["blackout"]["gap_s"],
                                     sent=rx_report["sent"], received=rx_report["unique"],
                                     lost=rx_report["lost"],
                                     reconnects=len(tx_report.get("qp_pinned", {})
                                                    .get("reconnects", [])),
                                     receiver=rx_report, sender=tx_report)
        fences = {host: n - fences_before[host] for host, n in self.fence_counts().items()}
        return TrialResult(mechanism=self.mechanism, fault=fault, rail=rail,
                           description=injector.description, injected_at=injected,
                           cleared_at=cleared or injected, flows=flows, status_during=during,
                           nccl_env_during=nccl_during, steps=steps, fences=fences)

    def _launch(self, host: str, argv: list[str], log: Path, **kw: Any) -> "Launched":
        with open(log, "wb") as out:
            proc = self.lab.popen(host, argv, stdout=out, stderr=subprocess.STDOUT, **kw)
        return Launched(proc, f"{' '.join(argv[:4])} in {host}")

    @staticmethod
    def _await_marker(procs: dict[str, "Launched"], work: Path, kind: str,
                      marker: str, timeout: float = 15.0) -> None:
        """Wait until every flow's log shows `marker`; a process that exits
        first, or a marker that never shows, fails with that process's log."""
        deadline = time.monotonic() + timeout
        waiting = dict(procs)
        while waiting:
            for flow, launched in list(waiting.items()):
                log, proc = work / f"{kind}-{flow}.log", launched.proc
                if marker in log.read_text(errors="replace"):
                    del waiting[flow]
                elif proc.poll() is not None or time.monotonic() > deadline:
                    state = "exited" if proc.returncode is not None else f"no {marker!r} in {timeout:g} s"
                    raise RuntimeError(f"{launched.where} did not start ({state}):\n"
                                       f"{log.read_text(errors='replace')}")
            if waiting:
                time.sleep(0.02)

    @staticmethod
    def _t0(log: Path) -> float:
        match = READY_LINE.search(log.read_text(errors="replace"))
        assert match, f"no 'sending t0=' in {log}"
        return float(match.group(1))


@dataclass(frozen=True)
class Launched:
    """A trial's receiver or sender: its process and what to call it in errors."""

    proc: subprocess.Popen
    where: str

    def release(self, log: Path) -> None:
        """Tell a sender started with --hold to start its schedule. One that
        died after arming cannot be told: that fails with its log, not with
        a bare BrokenPipeError."""
        try:
            self.proc.stdin.write(b"go\n")
            self.proc.stdin.close()
        except BrokenPipeError as exc:
            self.proc.poll()
            raise RuntimeError(f"{self.where} exited (code {self.proc.returncode}) before"
                               f" it was told to go ({exc!r}):\n"
                               f"{log.read_text(errors='replace')}") from None


class Snapshot:
    """`linkpassctl status` and `nccl-env` on the sender, each in its own
    thread from now; result() waits for both. Their times go into `steps`."""

    def __init__(self, scenario: ScenarioLab, steps: dict[str, float]):
        self.steps, self.texts = steps, {}
        steps["snapshot_start"] = time.monotonic()
        self.threads = [threading.Thread(target=self._run, args=(name, fn), daemon=True)
                        for name, fn in (("status", scenario.status_text),
                                         ("nccl_env", scenario.nccl_env_text))]
        for t in self.threads:
            t.start()

    def _run(self, name: str, fn: Callable[[], str]) -> None:
        try:
            self.texts[name] = fn()
        except Exception as exc:  # noqa: BLE001 - reported in the text; the trial goes on
            self.texts[name] = f"{name} snapshot failed: {type(exc).__name__}: {exc}"
        self.steps[f"{name}_end"] = time.monotonic()

    def result(self, timeout: float = 30.0) -> tuple[str, str]:
        for t in self.threads:
            t.join(timeout)
        return (self.texts.get("status", "status snapshot still running"),
                self.texts.get("nccl_env", "nccl-env snapshot still running"))


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
