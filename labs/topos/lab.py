"""A running rail-optimised fabric in Mininet, torn down and checked on exit.

``Lab`` builds the nodes with Mininet (hosts only: leaves and spines are Linux
routers; no switch, no controller, no Open vSwitch), writes the plan's
addresses, routes and sysctls into them, and on exit clears every fault it
knows, stops every process it started (by PID), deletes its nftables tables,
stops Mininet, and then *verifies*: no process is left in any of its network
namespaces and no interface with a lab name is left in the root namespace.
A leak raises LabLeakError; it is never silently tolerated.

Mininet is used narrowly. It never runs its cleanup (``mn -c`` kills by
name); ``Mininet.init()`` is pre-empted because its fixLimits() rewrites
root-namespace sysctls (tcp_rmem, neighbour table sizes...), and a lab must
not change the machine it runs on.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from mininet.link import Link
from mininet.net import Mininet
from mininet.node import Host, Node
from mininet.topo import Topo

from labs.aggproc import AggregatorProc
from labs.frr import BfdPeer, FrrBfd, mnexec_attach
from labs.lldp import LabLldp, lldp_options, sniff_lldp
from labs.simsensor import SimSensor
from labs.topos import bgpfabric, frrbgp
from labs.topos.nl import LinkSetter, arp_who_has
from labs.topos.plan import (
    HOST_SPACE,
    LAB_NAME_RE,
    MECHANISMS,
    FabricPlan,
    HostPlan,
    HostRail,
    LabError,
    bfd_options,
    linkpassd_toml,
)

CMD_TIMEOUT_S = 10.0
PROC_STOP_S = 5.0
LEAK_WAIT_S = 3.0
CARRIER_WAIT_S = 5.0
# frr-bgp: sessions connect within ~1-3 s of FRR starting, BFD adds its 1 s
# slow start, zebra then installs; 30 s leaves room on a loaded 2-core VM.
FRR_BGP_READY_S = 30.0
CARRIER_EVENTS = ("physical", "urgent")
_TOOLS = ("mnexec", "ip", "nft", "ping", "sysctl")
_PING_SUMMARY = re.compile(r"(\d+) packets transmitted, (\d+) received")


class LabLeakError(RuntimeError):
    """Teardown left something behind (or failed): the message lists it."""


class _Veth(Link):
    """A veth pair with fixed ifindexes (see FabricPlan.link_ifindex), made
    directly in the two node namespaces, with errors raised, not printed."""

    def __init__(self, node1: Node, node2: Node, ifindex1: int = 0, ifindex2: int = 0, **params):
        self._ifindex = (ifindex1, ifindex2)
        super().__init__(node1, node2, **params)

    def makeIntfPair(self, intfname1, intfname2, addr1=None, addr2=None,  # Mininet API
                     node1=None, node2=None, deleteIntfs=True):
        i1, i2 = self._ifindex
        argv = ["mnexec", "-a", str(node1.pid), "ip", "link", "add", "name", intfname1]
        argv += ["index", str(i1)] if i1 else []
        argv += ["address", addr1] if addr1 else []
        argv += ["type", "veth", "peer", "name", intfname2]
        argv += ["index", str(i2)] if i2 else []
        argv += ["address", addr2] if addr2 else []
        argv += ["netns", str(node2.pid)]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=CMD_TIMEOUT_S)
        if proc.returncode:
            raise LabError(f"creating veth {intfname1}<->{intfname2}: {proc.stderr.strip()}")


class RailOptTopo(Topo):
    """Mininet's view of a FabricPlan: every node a host, every cable a veth."""

    def build(self, plan: FabricPlan, carrier_events: str = "physical") -> None:
        far = 0 if carrier_events == "physical" else 100_000
        for name in plan.node_names:
            self.addHost(name, ip=None)  # no Mininet 10/8 address, ever
        for host in plan.hosts:
            for rail in host.rails:
                self.addLink(host.name, rail.leaf, port1=rail.index,
                             port2=plan.leaf_position(host.index),
                             intfName1=rail.port, intfName2=rail.leaf_port,
                             addr1=rail.mac, addr2=rail.leaf_mac,
                             ifindex1=rail.ifindex, ifindex2=rail.ifindex + far)
        for up in plan.uplinks:
            self.addLink(up.leaf, up.spine, port1=plan.hosts_per_leaf + up.spine_index,
                         port2=up.leaf_index,
                         intfName1=up.leaf_port, intfName2=up.spine_port,
                         addr1=up.leaf_mac, addr2=up.spine_mac,
                         ifindex1=up.ifindex, ifindex2=up.ifindex + far)


@dataclass(frozen=True)
class PingResult:
    sent: int
    received: int

    @property
    def ok(self) -> bool:
        return self.sent > 0 and self.received == self.sent

    @property
    def loss(self) -> float:
        return 1.0 - self.received / self.sent if self.sent else 1.0


class Lab:
    """A built fabric. Use as a context manager::

        with Lab(FabricPlan(4, 2, 2), mechanism="kernel") as lab:
            lab.ping("lph1", lab.host("lph2").rail(0).address)

    ``mechanism`` sets host routing (see plan.FabricPlan._host_setup):
    ``none`` static per-rail tables, ``kernel`` the same plus linkdown-aware
    fallbacks, ``linkpassd`` connected routes only and a per-host linkpassd
    config written under the lab's work directory (the caller starts the
    daemon, e.g. with ``lab.popen``).

    ``carrier_events``: ``physical`` (default) gives both ends of a cable one
    ifindex (ifindex == iflink, as on a real NIC), so the kernel treats a
    carrier loss as a non-urgent linkwatch event that it may hold back for up
    to a second after its last run (see labs/bench/carrier_failover.py);
    ``urgent`` gives the ends different ifindexes, and the kernel reports at once.

    ``bfd`` (default None: off), e.g. ``{"interval_ms": 100, "detect_mult": 3}``
    and optionally ``"passive": True``: every leaf runs FRR (zebra + bfdd) with
    a single-hop peer toward each host port on it, from the leaf's half of the
    /31, through one BFD profile with those timers: the switch-side BFD a
    host's linkpassd talks to. Generated linkpassd configs then ask for BFD on
    every rail. FRR is up (configured, answering on its vty) when the lab is;
    sessions come Up once something in the host answers (see labs.bfdpeer).

    ``probes`` (default None: off), e.g. ``{"interval_ms": 50}``: with the
    ``linkpassd`` mechanism, echo probing on, rail r of each host probing
    every other host's rail-r address (``[probes]`` options as given).

    ``frr-bgp`` (needs ``bfd``): every host runs FRR too (zebra + bfdd +
    bgpd), with an eBGP session per rail to the leaf, tracked by BFD with the
    ``bfd`` timers; leaves run bgpd beside bfdd and announce 198.18.0.0/16,
    and their BFD sessions are the ones bgpd asks for (no static peers). See
    labs/topos/frrbgp.py. The lab is built once every session is Established,
    every BFD session Up and every host routes 198.18.0.0/16 via rail 0.

    ``lldp`` (default False): True runs a real lldpd in every leaf and spine
    namespace, ``{"hosts": True}`` in every host too, ``tx_interval_s``
    (default 1) and ``tx_hold`` tune it; see labs/lldp.py. System name = node
    name, port id = interface name; ``lldp_neighbours(node)`` reads them.
    The build waits until every lldpd sees its planned neighbours.
    """

    def __init__(self, plan: FabricPlan, mechanism: str = "none", *,
                 workdir: str | os.PathLike[str] | None = None,
                 carrier_events: str = "physical",
                 linkpassd_timers: dict[str, float | int] | None = None,
                 linkpassd_log_level: str = "info",
                 bfd: dict | None = None, probes: dict | None = None,
                 aggregator: bool | dict = False, mesh: bool = False, lldp: bool | dict = False):
        if mechanism not in MECHANISMS:
            raise LabError(f"mechanism must be one of {', '.join(MECHANISMS)}, got {mechanism!r}")
        if carrier_events not in CARRIER_EVENTS:
            raise LabError(f"carrier_events must be one of {', '.join(CARRIER_EVENTS)}")
        if mechanism == frrbgp.MECHANISM and bfd is None:
            raise LabError("frr-bgp tracks each rail with BFD: give bfd={'interval_ms': ..., "
                           "'detect_mult': ...}")
        if mechanism == frrbgp.MECHANISM and plan.leaves_per_rail > 1:
            raise LabError("frr-bgp speaks to one leaf per rail: leaves_per_rail must be 1")
        if mechanism == frrbgp.MECHANISM and plan.fabric == "bgp" and plan.n_rails != 2:
            raise LabError("frr-bgp on the bgp fabric backs each rail up with the other one "
                           f"(labs/topos/frrbgp.py): it needs 2 rails, not {plan.n_rails}")
        self.plan = plan
        self.mechanism = mechanism
        self.carrier_events = carrier_events
        self.linkpassd_timers = dict(linkpassd_timers or {})
        self.linkpassd_log_level = linkpassd_log_level
        self.bfd = bfd_options(bfd)
        self.probes = None if probes is None else dict(probes)
        self.lldp_options = lldp_options(lldp)
        self.lldp: LabLldp | None = None
        # `aggregator`: a linkpass-aggregator in the root namespace (labs.aggproc),
        # reached by the daemons over a Unix socket in the work directory (a
        # dict: AggregatorProc options, e.g. {"validation_budget_pps": 2000});
        # with `mesh` the configs name no probe peers: the aggregator's mesh does.
        if mesh and not aggregator:
            raise LabError("mesh=True needs aggregator=True")
        if not isinstance(aggregator, (bool, dict)):
            raise LabError(f"aggregator must be a bool or a dict of options, got {aggregator!r}")
        self.want_aggregator = bool(aggregator)
        self.aggregator_options = dict(aggregator) if isinstance(aggregator, dict) else {}
        self.aggregator: AggregatorProc | None = None
        self.mesh = mesh
        # Extra echo peers per rail index, added to every host's probe_peers
        # (labs.scenario's stand-in peers); set before start().
        self.extra_echo_peers: dict[int, list[str]] = {}
        self._own_workdir = workdir is None
        self._workdir_arg = workdir
        self.workdir: Path | None = None
        self.net: Mininet | None = None
        self.nodes: dict[str, Node] = {}
        self._netns: dict[int, str] = {}  # netns inode -> node name
        self._pids: dict[str, int] = {}
        self._procs: list[tuple[str, subprocess.Popen]] = []
        self._faults: list[Any] = []
        self._setters: dict[str, LinkSetter] = {}
        self._frr: dict[str, FrrBfd] = {}  # node -> its FRR (leaves; hosts too in frr-bgp)
        self._frr_dirs: list[Path] = []
        self._lock = threading.Lock()
        self._started = False
        self._closed = False
        self._stopped = False  # Mininet stopped: nodes are gone

    # ---- lifecycle -------------------------------------------------------------

    def __enter__(self) -> "Lab":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> "Lab":
        if self._started:
            raise LabError("lab already started")
        self._started = True
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _build(self) -> None:
        if os.geteuid() != 0:
            raise LabError("a Mininet lab needs root")
        missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
        if missing:
            raise LabError(f"missing tools: {', '.join(missing)}")
        if self._own_workdir:
            self.workdir = Path(tempfile.mkdtemp(prefix="lplab-", dir="/tmp"))
        else:
            self.workdir = Path(self._workdir_arg)  # type: ignore[arg-type]
            self.workdir.mkdir(parents=True, exist_ok=True)
        Mininet.inited = True  # skip Mininet.init(): fixLimits() edits root sysctls
        topo = RailOptTopo(self.plan, carrier_events=self.carrier_events)
        self.net = Mininet(topo=topo, controller=None, host=Host, link=_Veth,
                           autoSetMacs=False,  # every port has a plan MAC already
                           build=False, ipBase="198.18.0.0/15", waitConnected=False)
        self.net.build()  # nodes (mnexec shells) then links; no switches exist
        self.net.start()
        for name in self.plan.node_names:
            node = self.net[name]
            self.nodes[name] = node
            self._pids[name] = node.pid
            self._netns[os.stat(f"/proc/{node.pid}/ns/net").st_ino] = name
        for name in self.plan.node_names:
            setup = self.plan.setup(name, self.mechanism)
            self.run(name, ["sysctl", "-q", "-w",
                            *(f"{k}={v}" for k, v in setup.sysctls.items())])
            if setup.ip_batch:
                self.run(name, ["ip", "-batch", "-"], input="\n".join(setup.ip_batch) + "\n")
        if self.want_aggregator:
            self.aggregator = AggregatorProc(self.workdir / "aggregator", **self.aggregator_options)
        if self.plan.fabric != "bgp":
            for host in self.plan.hosts:
                self._write_host_files(host)
        if self.aggregator is not None:
            self.aggregator.start()
        deadline = time.monotonic() + CARRIER_WAIT_S
        for host in self.plan.hosts:
            for rail in host.rails:
                while not self.carrier(host.name, rail.port):
                    if time.monotonic() > deadline:
                        raise LabError(f"{rail.port}: no carrier {CARRIER_WAIT_S}s after build")
                    time.sleep(0.02)
        if self.lldp_options:  # its processes join _procs: teardown stops them by PID
            self.lldp = LabLldp(self, self.lldp_options)
            self.lldp.start()
        if self.plan.fabric == "bgp":
            self._start_bgp_fabric()  # the hosts' linkpassd configs name their FRR
            for host in self.plan.hosts:
                self._write_host_files(host)
            self.wait_fabric()
        elif self.bfd:
            self._start_frr()
        if self.mechanism == frrbgp.MECHANISM:
            self.wait_frr_bgp()

    def _start_frr(self) -> None:
        """One FRR per leaf (and per host in frr-bgp), all started at once
        (each can take seconds). Their processes join the lab's, so
        teardown's leak check covers them even if a start failed half-way."""
        bfd = self.bfd
        assert bfd is not None
        for leaf in self.plan.leaves:
            runner = mnexec_attach(self.pid(leaf.name))
            if self.mechanism == frrbgp.MECHANISM:  # one leaf per rail (checked at init)
                self._frr[leaf.name] = FrrBfd(None, [], runner=runner,
                                              bgp=frrbgp.leaf_speaker(self.plan, leaf.rail, bfd))
                continue
            ports = [self.plan.host_rail(i, leaf.rail) for i in leaf.hosts]
            peers = [BfdPeer(peer=p.address, local=p.gateway,
                             ifname=p.leaf_port, transmit_ms=bfd["interval_ms"],
                             receive_ms=bfd["interval_ms"], detect_mult=bfd["detect_mult"],
                             passive=bfd["passive"]) for p in ports]
            self._frr[leaf.name] = FrrBfd(None, peers, runner=runner)
        if self.mechanism == frrbgp.MECHANISM:
            for host in self.hosts:
                self._frr[host.name] = FrrBfd(None, [], runner=mnexec_attach(self.pid(host.name)),
                                              bgp=frrbgp.host_speaker(host, bfd))
        self._start_all_frr()

    def _start_all_frr(self) -> None:
        try:
            with ThreadPoolExecutor(max_workers=len(self._frr)) as pool:
                for started in [pool.submit(frr.start) for frr in self._frr.values()]:
                    started.result()
        finally:
            for leaf, frr in self._frr.items():
                if frr.dir is not None:
                    self._frr_dirs.append(frr.dir)
                self._procs.extend((leaf, proc) for proc in frr.procs.values())

    def _start_bgp_fabric(self) -> None:
        """The ``bgp`` fabric (labs/topos/bgpfabric.py): bgpd on every leaf
        and spine (the leaves with bfdd when the lab has ``bfd``: their
        sessions with host ports are BFD-tracked), and with the ``linkpassd``
        mechanism zebra + bgpd on every host, configured from its linkpassd
        config as linkpassd.announce_frr prints it (no bfdd on a host: its
        BFD speaker is linkpassd). Every zebra, the hosts' too, runs with
        bgpfabric.ZEBRA_CONF (no route-processing hold)."""
        from linkpassd.announce_frr import bgpd_config, zebra_config
        from linkpassd.config import parse_config

        frr_hosts = self.mechanism == frrbgp.MECHANISM
        for name, switch in bgpfabric.switches(self.plan, self.bfd,
                                               serves_hosts=frr_hosts).items():
            self._frr[name] = FrrBfd(None, [], runner=mnexec_attach(self.pid(name)),
                                     profiles=switch.profiles, zebra_conf=bgpfabric.ZEBRA_CONF,
                                     bgpd_conf=bgpfabric.bgpd_config(switch),
                                     bfdd=bool(switch.profiles))
        if self.mechanism == "linkpassd":
            for host in self.hosts:
                cfg = parse_config(self.host_config_toml(host), source=f"<lab {host.name}>")
                bgpd = bgpd_config(cfg, connect_retry_s=bgpfabric.CONNECT_RETRY_S)
                self._frr[host.name] = FrrBfd(
                    None, [], runner=mnexec_attach(self.pid(host.name)),
                    zebra_conf=zebra_config(cfg) + bgpfabric.ZEBRA_CONF, bfdd=False,
                    bgpd_conf=f"frr defaults traditional\nhostname {host.name}\n!\n" + bgpd)
        if frr_hosts:  # FRR alone: its own BFD (bfdd) and announcements
            assert self.bfd is not None  # checked at init
            leaf_asns = {leaf.rail: bgpfabric.leaf_asn(leaf.index) for leaf in self.plan.leaves}
            host_profile, _ = frrbgp.profiles(self.bfd)
            for host in self.hosts:
                self._frr[host.name] = FrrBfd(
                    None, [], runner=mnexec_attach(self.pid(host.name)),
                    profiles=[host_profile], zebra_conf=bgpfabric.ZEBRA_CONF,
                    bgpd_conf=frrbgp.fabric_host_bgpd(host, self.bfd, leaf_asns))
        self._start_all_frr()

    def close(self) -> None:
        """Tear down; idempotent. Raises LabLeakError if anything was left.
        Every step runs even when an earlier one failed."""
        if self._closed:
            return
        self._closed = True
        problems: list[str] = []

        def step(what: str, fn) -> None:
            try:
                result = fn()
                if isinstance(result, list):
                    problems.extend(result)
            except Exception as exc:  # noqa: BLE001 - keep tearing down; report at the end
                problems.append(f"{what}: {exc}")

        try:
            for fault in reversed(list(self._faults)):
                step(f"clearing {fault}", fault.clear)
                step(f"disarming {fault}", fault.disarm)  # rules/qdiscs/sockets installed by arm()
            step("stopping FRR", self._stop_frr)
            step("stopping processes", self._stop_processes)
            if self.aggregator is not None:  # after the daemons: they may report to the end
                step("stopping the aggregator", self._stop_aggregator)
            if self.net is not None:
                for name in self.nodes:
                    step(f"{name}: nft cleanup", lambda n=name: self._delete_nft_tables(n))
        finally:
            for setter in self._setters.values():
                setter.close()  # an open socket would keep its namespace alive
            self._setters.clear()
            if self.net is not None:
                for node in self.net.hosts:  # also nodes of a build that failed half-way
                    if node.pid and node.name not in self._pids:
                        try:
                            ino = os.stat(f"/proc/{node.pid}/ns/net").st_ino
                        except OSError:
                            continue
                        self._pids[node.name] = node.pid
                        self._netns[ino] = node.name
                self._stopped = True
                step("net.stop()", self.net.stop)
            problems += self._leaks()
            for frr in self._frr.values():
                frr.cleanup()
            problems += [f"FRR directory {d} left behind" for d in self._frr_dirs if d.exists()]
            if self._own_workdir and self.workdir is not None:
                shutil.rmtree(self.workdir, ignore_errors=True)
        if problems:
            raise LabLeakError("lab teardown left problems:\n  " + "\n  ".join(problems))

    def _stop_aggregator(self) -> list[str]:
        code = self.aggregator.stop()
        return [] if code in (0, None) else [
            f"aggregator exited with {code}; its log ends:\n{self.aggregator.log_tail(1500)}"]

    def _stop_frr(self) -> list[str]:
        """bgpd, bfdd, then zebra in each node (FrrBfd.stop), by PID; anything
        that survives is still in _procs for _stop_processes and the leak check."""
        problems = []
        for node, frr in self._frr.items():
            try:
                frr.stop(timeout=PROC_STOP_S)
            except Exception as exc:  # noqa: BLE001 - the next node's FRR must still stop
                problems.append(f"{node}: stopping FRR: {exc}")
        return problems

    def _stop_processes(self) -> list[str]:
        problems = []
        for _name, proc in self._procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + PROC_STOP_S
        for name, proc in self._procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                try:
                    proc.wait(PROC_STOP_S)
                except subprocess.TimeoutExpired:
                    problems.append(f"{name}: pid {proc.pid} survived SIGKILL")
        return problems

    def _leaks(self) -> list[str]:
        """Processes still in our namespaces, our node shells, lab-named
        interfaces or named namespaces in the root namespace."""
        deadline = time.monotonic() + LEAK_WAIT_S
        while True:
            found = []
            for name, pid in self._pids.items():
                if _alive(pid):
                    found.append(f"{name}: shell pid {pid} still running")
            for name, proc in self._procs:
                if proc.poll() is None:
                    found.append(f"{name}: started pid {proc.pid} still running")
            for pid, ino in _netns_of_all_processes():
                if ino in self._netns:
                    found.append(f"pid {pid} ({_cmdline(pid)}) still in {self._netns[ino]}'s netns")
            for fd_target in _own_fd_targets():
                m = re.fullmatch(r"net:\[(\d+)\]", fd_target)
                if m and int(m.group(1)) in self._netns:
                    found.append(f"this process holds {self._netns[int(m.group(1))]}'s netns open")
            found += [f"interface {n} left in the root namespace" for n in root_lab_interfaces()]
            found += [f"named netns {n} exists" for n in lab_named_netns()]
            if not found or time.monotonic() > deadline:
                return found
            time.sleep(0.05)

    # ---- topology ----------------------------------------------------------------

    @property
    def hosts(self) -> tuple[HostPlan, ...]:
        return self.plan.hosts

    @property
    def leaves(self) -> list[str]:
        return self.plan.leaf_names

    @property
    def spines(self) -> list[str]:
        return self.plan.spine_names

    def host(self, name: str | int | HostPlan) -> HostPlan:
        return name if isinstance(name, HostPlan) else self.plan.host(name)

    def rail(self, host: str | int | HostPlan, rail: int | str) -> HostRail:
        """The host's port on ``rail``; LabError names what exists otherwise."""
        return self.host(host).rail(rail)

    def node(self, name: str | Node | HostPlan) -> Node:
        if isinstance(name, HostPlan):
            name = name.name
        if isinstance(name, Node):
            return name
        if self.net is None or self._stopped:
            raise LabError("the lab is not running")
        try:
            return self.nodes[name]
        except KeyError:
            raise LabError(f"no node {name!r} in this lab "
                           f"(nodes: {', '.join(self.plan.node_names)})") from None

    def pid(self, name: str | Node | HostPlan) -> int:
        return self.node(name).pid

    @property
    def netns_inodes(self) -> dict[int, str]:
        """Network namespace inode -> node name, recorded at build: the
        identity teardown checks against (names can repeat across labs)."""
        return dict(self._netns)

    # ---- running things in nodes --------------------------------------------------

    def run(self, node: str | Node | HostPlan, argv: Sequence[str] | str, *, check: bool = True,
            timeout: float = CMD_TIMEOUT_S, input: str | None = None) -> subprocess.CompletedProcess:
        """Run a command in a node's namespaces, bounded; ``argv`` as a list,
        or a string split like a shell would (no shell runs)."""
        n = self.node(node)
        args = shlex.split(argv) if isinstance(argv, str) else list(argv)
        proc = subprocess.run(["mnexec", "-a", str(n.pid), *args], input=input,
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise LabError(f"{n.name}: {' '.join(args)}: exit {proc.returncode}: "
                           f"{(proc.stderr or proc.stdout).strip()}")
        return proc

    def sh(self, node: str | Node | HostPlan, script: str, **kw: Any) -> subprocess.CompletedProcess:
        return self.run(node, ["sh", "-c", script], **kw)

    def popen(self, node: str | Node | HostPlan, argv: Sequence[str], **kw: Any) -> subprocess.Popen:
        """Start a long-running process in a node; the lab stops it (SIGTERM,
        then SIGKILL, by PID) on teardown and checks it is gone."""
        n = self.node(node)
        kw.setdefault("stdin", subprocess.DEVNULL)
        proc = subprocess.Popen(["mnexec", "-da", str(n.pid), *argv], **kw)
        self._procs.append((n.name, proc))
        return proc

    def set_link(self, node: str | Node, ifname: str, up: bool | None = None,
                 group: int | None = None) -> float:
        """Link up/down and/or interface group by one netlink request; returns
        the monotonic time taken right before it (see labs.topos.nl)."""
        return self.set_link_timed(node, ifname, up=up, group=group)[0]

    def set_link_timed(self, node: str | Node, ifname: str, up: bool | None = None,
                       group: int | None = None) -> tuple[float, float]:
        """As set_link(), returning (sent, acked) monotonic stamps: the change
        took effect in the kernel between the two (LinkSetter.set_timed)."""
        return self._setter(node).set_timed(ifname, up=up, group=group)

    def netlink_request(self, node: str | Node, message: bytes, what: str) -> tuple[float, float]:
        """One rtnetlink request encoded ahead (a qdisc change, say) on the
        node's netlink socket: (sent, acked) stamps, as set_link_timed()."""
        return self._setter(node).request(message, what)

    def _setter(self, node: str | Node) -> LinkSetter:
        n = self.node(node)
        with self._lock:
            setter = self._setters.get(n.name)
            if setter is None:
                setter = self._setters[n.name] = LinkSetter(n.pid, n.name)
        return setter

    def link(self, node: str | Node, ifname: str) -> dict:
        (info,) = json.loads(self.run(node, ["ip", "-j", "-d", "link", "show", "dev", ifname]).stdout)
        return info

    def carrier(self, node: str | Node, ifname: str) -> bool:
        return "LOWER_UP" in self.link(node, ifname)["flags"]

    def carrier_down_count(self, node: str | Node, ifname: str) -> int:
        """The kernel's count of carrier losses on the port (iproute2 6.1 does
        not print it; the node's own sysfs mount does)."""
        out = self.run(node, ["cat", f"/sys/class/net/{ifname}/carrier_down_count"]).stdout
        return int(out.strip())

    def neighbours(self, node: str | Node, ifname: str) -> list[dict]:
        return json.loads(self.run(node, ["ip", "-j", "neigh", "show", "dev", ifname]).stdout or "[]")

    def who_has(self, node: str | Node, ifname: str, ip: str, timeout_s: float = 1.0) -> str | None:
        """The MAC that answers ARP for ``ip`` on the node's ``ifname`` (a
        passive RFC 5227 probe: nobody learns a neighbour from it)."""
        return arp_who_has(self.node(node).pid, ifname, ip, timeout_s)

    def ping(self, src: str | HostPlan, dst: str, *, src_addr: str | None = None, count: int = 1,
             interval_s: float = 0.2, wait_s: float = 1.0) -> PingResult:
        """``ping`` from a node: exactly ``count`` echoes, ``interval_s`` apart,
        each waited for at most ``wait_s``; never raises for loss."""
        bound = count * interval_s + wait_s + 5.0
        argv = ["ping", "-n", "-q", "-c", str(count), "-i", f"{interval_s:g}", "-W", f"{wait_s:g}"]
        if src_addr:
            argv += ["-I", src_addr]
        proc = self.run(src, [*argv, dst], check=False, timeout=bound)
        m = _PING_SUMMARY.search(proc.stdout)
        if not m:
            raise LabError(f"ping from {src} to {dst} failed to run: {proc.stderr.strip()}")
        return PingResult(int(m.group(1)), int(m.group(2)))

    def reachability(self, *, count: int = 1, wait_s: float = 1.0,
                     pairs: Iterable[tuple[str, str]] | None = None) -> list[dict]:
        """Ping every ordered host pair on every rail, source bound to the
        rail address; in parallel, so a broken lab costs one wait, not N²."""
        names = [h.name for h in self.hosts]
        todo = [(a, b, r) for a, b in (pairs or ((a, b) for a in names for b in names if a != b))
                for r in range(self.plan.n_rails)]

        def one(item: tuple[str, str, int]) -> dict:
            a, b, r = item
            src, dst = self.rail(a, r), self.rail(b, r)
            res = self.ping(a, dst.address, src_addr=src.address, count=count, wait_s=wait_s)
            return {"src": a, "dst": b, "rail": r, "from": src.address, "to": dst.address,
                    "sent": res.sent, "received": res.received, "ok": res.ok}

        with ThreadPoolExecutor(max_workers=8) as pool:
            return list(pool.map(one, todo))

    # ---- LLDP (labs/lldp.py) -------------------------------------------------------

    def lldp_neighbours(self, node: str | HostPlan) -> dict[str, tuple[str, str]]:
        """{port: (system name, port id)} as the node's lldpd sees them."""
        if self.lldp is None:
            raise LabError("this lab runs no lldpd (Lab(..., lldp=True))")
        return self.lldp.neighbours(self.node(node).name)

    def sniff_lldp(self, node: str | HostPlan, ifname: str,
                   timeout_s: float = 5.0) -> tuple[str, str] | None:
        """(system name, port id) of the next LLDP frame arriving on the
        node's ``ifname``, decoded by scapy; None if none within ``timeout_s``."""
        return sniff_lldp(self.pid(node), ifname, timeout_s)

    # ---- nftables ------------------------------------------------------------------

    def nft(self, node: str | Node, script: str) -> None:
        self.run(node, ["nft", "-f", "-"], input=script)

    def nft_tables(self, node: str | Node) -> list[tuple[str, str]]:
        out = self.run(node, ["nft", "-j", "list", "tables"]).stdout
        items = json.loads(out).get("nftables", []) if out.strip() else []
        return [(t["table"]["family"], t["table"]["name"]) for t in items if "table" in t]

    def _delete_nft_tables(self, node: str) -> None:
        """Delete the lab's fault tables (lp_*) in a node; nothing else."""
        for family, name in self.nft_tables(node):
            if name.startswith("lp_"):
                self.nft(node, f"delete table {family} {name}\n")

    # ---- FRR: BFD on the leaves; eBGP + BFD everywhere in frr-bgp ---------------

    def frr(self, node: str | int | HostPlan) -> FrrBfd:
        """The FRR of a leaf (by name or rail number), or in frr-bgp of a
        host, for vtysh and logs."""
        if isinstance(node, HostPlan):
            node = node.name
        name = self.plan.leaf_of(node) if isinstance(node, int) else node
        if not self._frr:
            raise LabError("this lab runs no FRR (Lab(..., bfd={...}) or the bgp fabric)")
        try:
            return self._frr[name]
        except KeyError:
            raise LabError(f"no FRR in {name!r} in this lab "
                           f"(FRR runs in: {', '.join(self._frr)})") from None

    def fabric_routes(self, host: str | HostPlan) -> list[dict]:
        """The host's main-table routes for exactly 198.18.0.0/16 (``ip -j``)."""
        out = self.run(host, ["ip", "-j", "route", "show", "table", "main", "exact",
                              HOST_SPACE]).stdout
        return json.loads(out or "[]")

    def wait_frr_bgp(self, timeout: float = FRR_BGP_READY_S) -> float:
        """frr-bgp settled: every BGP session Established and every BFD
        session Up, seen from both ends, and every host routing
        198.18.0.0/16 via its rail-0 gateway. The state a fault is measured
        from; the build waits for it, and a test can after clearing a fault.
        Returns the seconds it took; LabError names what is missing."""
        if self.mechanism != frrbgp.MECHANISM:
            raise LabError(f"mechanism {self.mechanism} runs no BGP")
        started = time.monotonic()
        while True:
            missing = self.frr_bgp_missing()
            if not missing:
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                raise LabError(f"frr-bgp not ready after {timeout:g}s:\n  " + "\n  ".join(missing))
            time.sleep(0.1)

    def frr_bgp_missing(self) -> list[str]:
        """What keeps frr-bgp from its settled state (wait_frr_bgp), one
        line each; on the bgp fabric the fabric's own check too, with the
        leaves' BFD sessions with the hosts (the hosts' bfdd)."""
        missing = self.fabric_missing(bfd=True) if self.plan.fabric == "bgp" else []
        for node, frr in self._frr.items():
            states = frr.try_read(frr.bgp_states) or {}
            bfd = {p.get("peer"): p.get("status") for p in frr.try_read(frr.bfd_peers) or []}
            for n in frr.bgp.neighbors if frr.bgp else ():
                if states.get(n.address) != "Established":
                    missing.append(f"{node}: BGP with {n.address} is "
                                   f"{states.get(n.address, 'not listed')}, not Established")
                if bfd.get(n.address) != "up":
                    missing.append(f"{node}: BFD with {n.address} is "
                                   f"{bfd.get(n.address, 'not listed')}, not up")
        for host in self.hosts:
            # every rail's leaf heard from, not only the preferred one: a
            # test that looks at the backup path must not find it missing
            # (fresh-clone CI: rail 1's path not there yet, sessions Established)
            frr = self._frr[host.name]
            paths = (frr.try_read(lambda f=frr: json.loads(f.vtysh(
                f"show bgp ipv4 unicast {HOST_SPACE} json")).get("paths", [])) or [])
            learnt = {p["nexthops"][0]["ip"] for p in paths if p.get("nexthops")}
            missing += [f"{host.name}: {HOST_SPACE} not learnt from {r.gateway} "
                        f"(rail{r.index}'s leaf) yet" for r in host.rails
                        if r.gateway not in learnt]
            rail = host.rails[0]
            routes = self.fabric_routes(host)
            if not any(r.get("gateway") == rail.gateway and r.get("dev") == rail.port
                       for r in routes):
                have = "; ".join(f"via {r.get('gateway')} dev {r.get('dev')} "
                                 f"proto {r.get('protocol')}" for r in routes) or "nothing"
                missing.append(f"{host.name}: no {HOST_SPACE} via {rail.gateway} dev {rail.port} "
                               f"in main (main has: {have})")
        return missing

    def wait_fabric(self, timeout: float = FRR_BGP_READY_S, *, bfd: bool = False) -> float:
        """The bgp fabric settled (see fabric_missing); returns the seconds it
        took, LabError names what is missing at the deadline."""
        started = time.monotonic()
        while True:
            missing = self.fabric_missing(bfd=bfd)
            if not missing:
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                raise LabError(f"bgp fabric not ready after {timeout:g}s:\n  "
                               + "\n  ".join(missing))
            time.sleep(0.1)

    def fabric_missing(self, *, bfd: bool = False) -> list[str]:
        """What keeps the bgp fabric from its healthy state, one line each
        ([] when settled): every switch-to-switch session Established, and
        every leaf-to-host one when the hosts run FRR (and with ``bfd`` its
        BFD session up: linkpassd must be running); every leaf routes every
        other leaf's host subnets, and no leaf holds a BGP route for a host
        address of its own ports (nothing detoured)."""
        if self.plan.fabric != "bgp":
            raise LabError("this lab's fabric is static")
        missing = []
        hosts_speak = self.mechanism in ("linkpassd", frrbgp.MECHANISM)
        switches = bgpfabric.switches(self.plan, self.bfd)
        for name, switch in switches.items():
            frr = self._frr[name]
            states = frr.try_read(frr.bgp_states) or {}
            peers = {p.get("peer"): p.get("status") for p in
                     (frr.try_read(frr.bfd_peers) or [])} if bfd and switch.profiles else {}
            for p in switch.peers:
                if p.host and not hosts_speak:
                    continue
                if states.get(p.address) != "Established":
                    missing.append(f"{name}: BGP with {p.address} is "
                                   f"{states.get(p.address, 'not listed')}, not Established")
                if bfd and p.bfd is not None and peers.get(p.address) != "up":
                    missing.append(f"{name}: BFD with {p.address} is "
                                   f"{peers.get(p.address, 'not listed')}, not up")
        for leaf in self.plan.leaves:
            routes = json.loads(self.run(leaf.name, ["ip", "-j", "route", "show", "proto",
                                                     "bgp"]).stdout or "[]")
            have = {r.get("dst") for r in routes}
            own = {self.plan.host_rail(i, leaf.rail) for i in leaf.hosts}
            for other in self.plan.leaves:
                if other.name == leaf.name:
                    continue
                for i in other.hosts:
                    subnet = self.plan.host_rail(i, other.rail).subnet
                    if subnet not in have:
                        missing.append(f"{leaf.name}: no BGP route to {subnet} ({other.name})")
            for port in own:
                if port.address in have:
                    missing.append(f"{leaf.name}: {port.address} ({port.port}) is routed by BGP "
                                   "(detoured), not over its own port")
        return missing

    def bfd_peers(self, leaf: str | int) -> list[dict]:
        """``show bfd peers json`` of a leaf, parsed."""
        return self.frr(leaf).bfd_peers()

    def bfd_peer(self, host: str | int | HostPlan, rail: int | str) -> dict | None:
        """The leaf's view of its session with this host port (None if FRR
        does not list it)."""
        port = self.rail(host, rail)
        return next((p for p in self.bfd_peers(port.leaf) if p.get("peer") == port.address), None)

    # ---- faults bookkeeping (labs.faults) ---------------------------------------

    def _register_fault(self, fault: Any) -> None:
        if fault not in self._faults:
            self._faults.append(fault)

    # ---- linkpassd --------------------------------------------------------------

    def host_dir(self, host: str | HostPlan) -> Path:
        if self.workdir is None:
            raise LabError("the lab is not running")
        return self.workdir / self.host(host).name

    def run_dir(self, host: str | HostPlan) -> Path:
        return self.host_dir(host) / "run"

    def control_socket(self, host: str | HostPlan) -> str:
        return str(self.host_dir(host) / "linkpassd.sock")

    def config_path(self, host: str | HostPlan) -> Path:
        return self.host_dir(host) / "linkpassd.toml"

    def sim_path(self, host: str | HostPlan, port: str) -> Path:
        return self.run_dir(host) / "sim" / f"{port}.json"

    def host_config_toml(self, host: str | HostPlan) -> str:
        """linkpassd config for ``host`` (validated with parse_config)."""
        from linkpassd.config import parse_config

        plan = self.host(host)
        text = linkpassd_toml(plan, control_socket=self.control_socket(plan),
                              run_dir=str(self.run_dir(plan)), timers=self.linkpassd_timers,
                              log_level=self.linkpassd_log_level, bfd=self.bfd,
                              probes=self.probes,
                              peers=None if self.mesh else self.echo_peers(plan),
                              aggregator=self.aggregator.address if self.aggregator else None,
                              announce=self._announce_options(plan))
        parse_config(text, source=f"<lab {plan.name}>")
        return text

    def _announce_options(self, host: HostPlan) -> dict | None:
        """[announce] for a linkpassd host in the bgp fabric: its AS and
        where its FRR keeps its pid files (once that FRR exists)."""
        if self.plan.fabric != "bgp" or self.mechanism != "linkpassd":
            return None
        out: dict = {"local_asn": bgpfabric.host_asn(host.index),
                     "settle_community": bgpfabric.SETTLE_COMMUNITY}
        frr = self._frr.get(host.name)
        if frr is not None and frr.dir is not None:
            out["frr_run_dir"] = str(frr.run_dir)
        return out

    def echo_peers(self, host: str | HostPlan) -> dict[int, list[str]]:
        """Rail r of a host probes every other host's rail-r address (and
        `extra_echo_peers[r]`)."""
        plan = self.host(host)
        return {rail.index: [self.rail(other, rail.index).address for other in self.hosts
                             if other.name != plan.name]
                + self.extra_echo_peers.get(rail.index, [])
                for rail in plan.rails}

    def _write_host_files(self, host: HostPlan) -> None:
        (self.run_dir(host) / "sim").mkdir(parents=True, exist_ok=True)
        if self.mechanism == "linkpassd":
            self.config_path(host).write_text(self.host_config_toml(host))
        for rail in host.rails:
            SimSensor(self.sim_path(host, rail.port), rail.port).write_healthy()


# ---- root-namespace witnesses (read-only) ------------------------------------------


def root_lab_interfaces() -> list[str]:
    out = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True,
                         timeout=CMD_TIMEOUT_S, check=True).stdout
    return [link["ifname"] for link in json.loads(out or "[]")
            if LAB_NAME_RE.match(link.get("ifname", ""))]


def lab_named_netns() -> list[str]:
    out = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True,
                         timeout=CMD_TIMEOUT_S).stdout
    return [ns["name"] for ns in json.loads(out or "[]") if LAB_NAME_RE.match(ns.get("name", ""))]


def processes_in_netns(inodes: Iterable[int]) -> list[int]:
    """PIDs of every process whose network namespace is one of ``inodes``."""
    wanted = set(inodes)
    return [pid for pid, ino in _netns_of_all_processes() if ino in wanted]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _netns_of_all_processes() -> list[tuple[int, int]]:
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                out.append((int(entry.name), os.stat(f"/proc/{entry.name}/ns/net").st_ino))
            except OSError:
                pass  # exited meanwhile, or a kernel thread
    return out


def _own_fd_targets() -> list[str]:
    targets = []
    for entry in os.scandir("/proc/self/fd"):
        try:
            targets.append(os.readlink(entry.path))
        except OSError:
            pass
    return targets


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return "?"
