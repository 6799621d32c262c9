"""The host side of fleet validation against the real kernel: the validation
prober against a real echo responder (labs.echopeer) in the leaf namespace,
with and without an nftables 100 % drop; LLDP from a real lldpd announcing on
a veth, read off the wire and through a second lldpd; and a whole
validate_host run (carrier, speed, optics and counters from sim files, LLDP,
probes) on a two-rail netns pair. Every wait is bounded; every process is
ours and stopped by PID."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from labs.echopeer import EchoPeerProcess
from labs.netnslib import run, wait_for
from labs.simsensor import SimSensor
from linkpassd._proto.linkpass.v1 import fleet_pb2
from linkpassd.adapters import hostcheck, lldp
from linkpassd.adapters.echoresponder import ECHO_PORT
from linkpassd.adapters.simsensor import SimulatedSensor
from linkpassd.adapters.valprober import FLOWS, Phases, Target, run_probes

pytestmark = pytest.mark.netns

TABLE = f"lp_val{os.getpid()}"
LLDPD_READY_S = 20.0  # lldpd and its start-up lldpcli on a busy 2-core VM
PHASES = Phases(rate_pps=50, low_s=1.0, burst_pps=1000, burst_s=0.5, grace_s=1.0)


def targets_of(lab, *extra: tuple[int, str]) -> list[Target]:
    """Each rail probes its leaf address (where the echo peer answers)."""
    out = [Target(f"rail{r.index}", r.port, r.address, r.gateway, "leaf") for r in lab.rails]
    out += [Target(f"rail{i}", lab.rails[i].port, lab.rails[i].address, peer, "nobody")
            for i, peer in extra]
    return out


def test_the_prober_counts_every_probe_and_reply_and_a_dead_peer_spoils_no_other(lab):
    # 198.18.0.77 answers no ARP: its datagrams wait in the neighbour queue,
    # charged to the rail's socket (the default send buffer filled and
    # stopped every probe of the rail).
    with EchoPeerProcess(lab.leaf.name, duration=60):
        prober = run(run_probes(targets_of(lab, (0, "198.18.0.77")), PHASES,
                                netns=lab.host.name), timeout=30)
    assert prober.problems == [] and prober.notes == []
    live, dead = prober.tallies[:2], prober.tallies[2]
    for tally in live:
        assert (tally.sent, tally.burst_sent) == (50, 500)
        assert (tally.received, tally.burst_received) == (50, 500), tally.target
        assert 0 < tally.rtt_us(0.5) <= tally.rtt_us(0.99) < 1_000_000
        # spread evenly over the source ports, every one answered
        assert (tally.flows, tally.flows_silent) == (FLOWS, 0)
        assert max(tally.flow_sent) - min(tally.flow_sent) <= 1 and tally.flow_received == tally.flow_sent
    assert (dead.sent, dead.burst_sent, dead.received, dead.burst_received) == (50, 500, 0, 0)
    assert dead.rtt_us(0.5) == 0
    assert (dead.flows, dead.flows_silent) == (FLOWS, FLOWS)


def test_a_path_dropping_every_probe_receives_nothing_and_the_other_rail_everything(lab):
    lab.leaf.nft(f"add table inet {TABLE}\n"
                 f"add chain inet {TABLE} input {{ type filter hook input priority 0; "
                 f"policy accept; }}\n"
                 f'add rule inet {TABLE} input iifname "{lab.rails[0].peer}" '
                 f"udp dport {ECHO_PORT} counter drop\n")
    with EchoPeerProcess(lab.leaf.name, duration=60):
        prober = run(run_probes(targets_of(lab), PHASES, netns=lab.host.name), timeout=30)
    dropped, clean = prober.tallies
    assert (dropped.sent, dropped.burst_sent) == (50, 500)
    assert (dropped.received, dropped.burst_received) == (0, 0)
    assert (clean.received, clean.burst_received) == (50, 500)
    assert dropped_by_nft(lab.leaf) == 550  # the kernel's witness: every request of rail 0


def dropped_by_nft(ns) -> int:
    proc = subprocess.run(["ip", "netns", "exec", ns.name, "nft", "-j", "list", "table", "inet",
                           TABLE], capture_output=True, text=True, timeout=10, check=True)
    return sum(expr["counter"]["packets"] for item in json.loads(proc.stdout)["nftables"]
               if "rule" in item for expr in item["rule"]["expr"] if "counter" in expr)


# ---------------------------------------------------------------- LLDP


class Lldpd:
    """lldpd 1.0.x in one namespace, private socket and config, stopped by PID."""

    def __init__(self, netns: str, workdir: Path, name: str, ports: list[str], *,
                 system: str, receive_only: bool = False,
                 descriptions: dict[str, str] | None = None):
        self.socket = str(workdir / f"{name}.sock")
        conf = workdir / f"{name}.conf"
        lines = [f"configure system hostname {system}", "configure lldp tx-interval 1",
                 "configure lldp portidsubtype ifname"]
        lines += [f"configure ports {p} lldp portdescription {d}" for p, d in (descriptions or {}).items()]
        conf.write_text("\n".join(lines) + "\n")
        conf.chmod(0o644)
        args = ["ip", "netns", "exec", netns, "lldpd", "-d", "-u", self.socket,
                "-I", ",".join(ports), "-O", str(conf)]
        if receive_only:
            args.append("-r")
        self.log = open(workdir / f"{name}.log", "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


@pytest.fixture
def lldp_workdir():
    """lldpd drops privileges (user _lldpd) and runs lldpcli on its -O file
    through its socket: the directory must be reachable by that user, which
    pytest's tmp_path (under a 0700 directory) is not."""
    if shutil.which("lldpd") is None:
        pytest.skip("lldpd is not installed")
    path = Path(tempfile.mkdtemp(prefix="lp-lldp-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_lldp_from_the_wire_and_from_lldpd_names_the_leafs_system_and_port(lab, lldp_workdir):
    rail = lab.rails[0]
    leaf = Lldpd(lab.leaf.name, lldp_workdir, "leaf", [rail.peer], system="leaf-r0-a",
                 descriptions={rail.peer: "Ethernet1"})
    host = Lldpd(lab.host.name, lldp_workdir, "host", [rail.port], system="gpu-001",
                 receive_only=True)
    try:
        neighbour, why = run(lldp.sniff_lldp(rail.port, LLDPD_READY_S, lab.host.name),
                             timeout=LLDPD_READY_S + 10)
        assert why == "" and neighbour is not None
        assert (neighbour.system, neighbour.port_id, neighbour.port_descr, neighbour.source) == \
            ("leaf-r0-a", rail.peer, "Ethernet1", "wire")
        # The other rail's leaf port runs no lldpd: a bounded wait, then a named problem.
        silent, why = run(lldp.sniff_lldp(lab.rails[1].port, 1.5, lab.host.name), timeout=10)
        assert silent is None and why == f"no LLDP frame within 2 s on {lab.rails[1].port}"

        async def seen_by_lldpd():
            view = await lldp.query_lldpd(host.socket)
            return view if rail.port in view.neighbours else None
        view = run(wait_for(seen_by_lldpd, LLDPD_READY_S, "the host's lldpd to see the leaf"),
                   timeout=LLDPD_READY_S + 10)
        got = view.neighbours[rail.port]
        assert (got.system, got.switch_port, got.source) == ("leaf-r0-a", rail.peer, "lldpd")
    finally:
        host.stop()
        leaf.stop()


# ---------------------------------------------------------------- a whole host run


class SteppingSensor(SimulatedSensor):
    """The lab's sim files, plus a hook after each port's first counter read
    and first optics read (the start of the window), so a test can raise a
    counter or kill a module inside it."""

    def __init__(self, sim_dir, after_first_read, after_first_optics=lambda port: None) -> None:
        super().__init__(sim_dir)
        self.after_first_read = after_first_read
        self.after_first_optics = after_first_optics
        self.reads: dict[str, int] = {}
        self.optics_reads: dict[str, int] = {}

    async def counters(self, port):
        sample = await super().counters(port)
        self.reads[port] = self.reads.get(port, 0) + 1
        if self.reads[port] == 1:
            self.after_first_read(port)
        return sample

    async def optics(self, port):
        reading = await super().optics(port)
        self.optics_reads[port] = self.optics_reads.get(port, 0) + 1
        if self.optics_reads[port] == 1:
            self.after_first_optics(port)
        return reading


def test_a_host_run_reports_ports_and_pairs_as_measured(lab, lldp_workdir, tmp_path):
    r0, r1 = lab.rails
    sims = {r.port: SimSensor(tmp_path / "sim" / f"{r.port}.json", r.port) for r in lab.rails}
    for sim in sims.values():
        sim.write_healthy()
    sims[r0.port].reading["rx_power_dbm"] = [-30.0] * 4  # a dead optic on rail 0
    sims[r0.port].write()

    def crc_errors_on_rail1(port: str) -> None:
        if port == r1.port:
            sims[port].counters["rx_crc_errors"] += 17
            sims[port].write()

    def rail1_module_dies(port: str) -> None:  # healthy when first read, dead by the end
        if port == r1.port:
            sims[port].reading["rx_power_dbm"] = [-30.0] * 4
            sims[port].write()

    host_lldpd = None
    leaf = Lldpd(lab.leaf.name, lldp_workdir, "leaf", [r0.peer], system="leaf-r0-a")
    try:
        host_lldpd = Lldpd(lab.host.name, lldp_workdir, "host", [r0.port], system="gpu-001",
                           receive_only=True)
        run(wait_for(lambda: _knows(host_lldpd.socket, r0.port), LLDPD_READY_S,
                     "the host's lldpd to see the leaf"), timeout=LLDPD_READY_S + 10)
        context = hostcheck.HostContext(
            rails=tuple(hostcheck.RailPort(f"rail{r.index}", r.port, r.address) for r in lab.rails),
            sensor=SteppingSensor(tmp_path / "sim", crc_errors_on_rail1, rail1_module_dies),
            netns=lab.host.name, lldpd_socket=host_lldpd.socket)
        request = fleet_pb2.ValidateHost(
            run_id="run-7", duration_s=5.0, rate_pps=20, burst_pps=400, burst_s=1.0,
            ports=[fleet_pb2.ExpectedPort(port=r.port, rail=f"rail{r.index}", speed_mbps=10000,
                                          switch_name="leaf-r0-a", switch_port=r.peer)
                   for r in lab.rails],
            targets=[fleet_pb2.ProbeTarget(rail=f"rail{r.index}", peer=r.gateway, peer_host="leaf")
                     for r in lab.rails])
        assert hostcheck.request_errors(request) == []
        with EchoPeerProcess(lab.leaf.name, duration=60):
            result = run(hostcheck.validate_host(request, context), timeout=30)
    finally:
        if host_lldpd is not None:
            host_lldpd.stop()
        leaf.stop()
    ports = {p.port: p for p in result.ports}
    assert result.run_id == "run-7"
    assert [p.port for p in result.ports] == [r0.port, r1.port]
    for p in result.ports:
        assert p.carrier and p.speed_mbps == 10000  # veth says 10 Gb/s
    assert (ports[r0.port].lldp_system, ports[r0.port].lldp_port,
            ports[r0.port].lldp_source) == ("leaf-r0-a", r0.peer, "lldpd")
    assert ports[r1.port].lldp_source == "" and ports[r1.port].lldp_system == ""
    # The sniff listened for the window and heard nothing: a result (no
    # neighbour in the check), not a check that did not run (issue 31).
    assert not any("LLDP" in p for p in result.problems), result.problems
    assert any("rx_power_dbm" in text or "RX" in text for text in ports[r0.port].optics_problems)
    assert not any(text.startswith("at the window's end") for text in ports[r0.port].optics_problems)
    # rail 1's module was healthy at the start and dead at the end: read twice, found
    late = list(ports[r1.port].optics_problems)
    assert late and all(text.startswith("at the window's end: ") and "RX" in text for text in late), late
    assert context.sensor.optics_reads[r1.port] == 2
    assert dict(ports[r1.port].counters_rising) == {"rx_crc_errors": 17}
    assert dict(ports[r0.port].counters_rising) == {}
    for pair in result.pairs:
        assert pair.sent > 0 and pair.received == pair.sent
        assert pair.burst_sent > 0 and pair.burst_received == pair.burst_sent
        assert pair.rtt_p50_us > 0
        assert (pair.flows, pair.flows_silent) == (FLOWS, 0)
        # The peer's responder keeps receipts; nothing was lost either way.
        assert pair.receipts and (pair.requests_lost, pair.replies_lost) == (0, 0)
    assert list(result.problems) == [], result.problems


async def _knows(socket_path: str, port: str) -> bool:
    return port in (await lldp.query_lldpd(socket_path)).neighbours
