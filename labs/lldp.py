"""LLDP in a lab: a real ``lldpd`` per node, confined to that node's namespace.

Validation (issue 13) checks that each host port's LLDP neighbour is the
switch port the cabling plan names, so the lab's switches must speak LLDP as
real ones do. Each leaf and spine (and on request each host) runs its own
lldpd 1.0.x, started through the lab's ``popen`` (``mnexec -a <node pid>``:
the node's network namespace, never the root one), so the lab's teardown
stops it by PID and its leak check proves nothing of it survives.

What keeps it off the machine's real interfaces: the namespace holds only
the node's lab veths and ``lo``, and ``-I`` names exactly those veths
(exact names also bypass lldpd's "is this a physical port" guesses). Every
file lldpd writes by default is redirected into the lab's work directory:
control socket (``-u``), PID file (``-p``) and start-up configuration
(``-O``, so /etc/lldpd.d is never read). The one shared path is lldpd's
compiled-in privilege-separation chroot, /run/lldpd, an empty directory
it creates if missing.

lldpd starts paused and runs ``lldpcli`` on its ``-O`` file before it sends
anything, so the first frame already carries what the file sets: the node
name as system name (lldpd would otherwise announce the machine's
hostname), the interface name as port id (the default is the MAC), and a
short transmit interval (default 30 s) so a test sees a change in seconds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from labs.topos.nl import socket_in_netns
from labs.topos.plan import FabricPlan, LabError

LLDPD, LLDPCLI = "lldpd", "lldpcli"
ETH_P_LLDP = 0x88CC
PACKET_OUTGOING = 4  # sll_pkttype of a frame this host sent (AF_PACKET sees those too)
READY_S = 20.0  # lldpd answers and has applied its config (a busy 2-core VM)
DEFAULTS: dict[str, Any] = {"hosts": False, "tx_interval_s": 1, "tx_hold": 4}
_AGE = re.compile(r"(\d+) days?, (\d+):(\d+):(\d+)")


def lldp_options(lldp: bool | dict | None) -> dict | None:
    """A lab's ``lldp`` option, checked. False/None: off. True: the defaults
    (leaves and spines, 1 s transmit interval, TTL 4 intervals). A dict may
    set ``hosts`` (bool: an lldpd in every host namespace too),
    ``tx_interval_s`` (int 1..3600) and ``tx_hold`` (int 1..100)."""
    if lldp is None or lldp is False:
        return None
    if lldp is True:
        return dict(DEFAULTS)
    if not isinstance(lldp, dict):
        raise LabError(f"lldp must be a bool or a dict, got {lldp!r}")
    unknown = set(lldp) - set(DEFAULTS)
    if unknown:
        raise LabError(f"unknown lldp option(s) {', '.join(sorted(unknown))} "
                       f"(known: {', '.join(DEFAULTS)})")
    out = {**DEFAULTS, **lldp}
    if not isinstance(out["hosts"], bool):
        raise LabError(f"lldp hosts must be a bool, got {out['hosts']!r}")
    for key, hi in (("tx_interval_s", 3600), ("tx_hold", 100)):
        value = out[key]
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= hi:
            raise LabError(f"lldp {key} must be an integer in 1..{hi}, got {value!r}")
    return out


def startup_config(node: str, options: dict) -> str:
    """The lldpcli commands lldpd runs before it sends its first frame."""
    return "".join(f"{line}\n" for line in (
        f"configure system hostname {node}",
        "configure lldp portidsubtype ifname",
        f"configure lldp tx-interval {options['tx_interval_s']}",
        f"configure lldp tx-hold {options['tx_hold']}",
    ))


def parse_neighbours(doc: dict) -> dict[str, list[tuple[str, str, float]]]:
    """``lldpcli -f json0 show neighbors`` -> {local port: [(system name,
    port id, age in seconds), ...]}. json0 keeps every level a list, so one
    neighbour and several parse alike. Raises LabError on another shape."""
    out: dict[str, list[tuple[str, str, float]]] = {}
    try:
        for lldp in doc.get("lldp", []):
            for iface in lldp.get("interface", []):
                system = iface["chassis"][0]["name"][0]["value"]
                port_id = iface["port"][0]["id"][0]["value"]
                out.setdefault(iface["name"], []).append((system, port_id, _age_s(iface)))
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise LabError(f"unexpected lldpcli json0 neighbour output ({exc!r}): "
                       f"{json.dumps(doc)[:300]}") from None
    return out


def _age_s(iface: dict) -> float:
    m = _AGE.search(str(iface.get("age", "")))
    if not m:
        return 0.0
    days, hours, minutes, seconds = (int(x) for x in m.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


@dataclass
class Speaker:
    """One node's lldpd: its files and its process."""

    node: str
    ports: tuple[str, ...]
    dir: Path
    proc: subprocess.Popen | None = None

    @property
    def socket(self) -> str:
        return str(self.dir / "lldpd.ctl")

    @property
    def config(self) -> Path:
        return self.dir / "lldpd.conf"

    @property
    def log(self) -> Path:
        return self.dir / "lldpd.log"

    def argv(self) -> list[str]:
        ports = ",".join(self.ports)
        # -d: foreground (the lab stops it by PID); -dd would also log to stderr only.
        # -k -i: no kernel release, no LLDP-MED inventory: nothing about the machine.
        return [LLDPD, "-d", "-u", self.socket, "-p", str(self.dir / "lldpd.pid"),
                "-O", str(self.config), "-L", shutil.which(LLDPCLI) or LLDPCLI,
                "-I", ports, "-C", ports, "-k", "-i"]

    def log_tail(self, chars: int = 1500) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"


class LabNodes(Protocol):
    """What the lldpds need of their lab (topos.lab.Lab, which starts them):
    its plan and work directory, which network namespace is which node, and
    running commands inside a node."""

    plan: FabricPlan
    workdir: Path | None

    @property
    def netns_inodes(self) -> dict[int, str]: ...

    def run(self, node: str, argv: Sequence[str] | str, *,
            check: bool = True) -> subprocess.CompletedProcess: ...

    def popen(self, node: str, argv: Sequence[str], **kw: Any) -> subprocess.Popen: ...


class LabLldp:
    """The lldpds of one lab. Built by Lab when ``lldp`` is set."""

    def __init__(self, lab: LabNodes, options: dict):
        self.lab = lab
        self.options = options
        self.speakers: dict[str, Speaker] = {}

    def nodes(self) -> list[str]:
        plan = self.lab.plan
        return (plan.leaf_names + plan.spine_names
                + (plan.host_names if self.options["hosts"] else []))

    def start(self) -> None:
        """Start every speaker, then wait until each answers on its socket
        with its config applied and runs in its own node's namespace."""
        missing = [tool for tool in (LLDPD, LLDPCLI) if shutil.which(tool) is None]
        if missing:
            raise LabError(f"lldp needs {' and '.join(missing)} (apt-get install lldpd)")
        workdir = self.lab.workdir
        assert workdir is not None
        for node in self.nodes():
            speaker = Speaker(node, tuple(_node_ports(self.lab, node)), workdir / node / "lldpd")
            speaker.dir.mkdir(parents=True, exist_ok=True)
            # lldpd's own lldpcli (run at start) works as the unprivileged lldpd
            # user and must reach the socket: let others traverse, not list.
            for path in (workdir, speaker.dir.parent, speaker.dir):
                os.chmod(path, os.stat(path).st_mode | 0o111)
            speaker.config.write_text(startup_config(node, self.options))
            with open(speaker.log, "ab") as log:
                speaker.proc = self.lab.popen(node, speaker.argv(), stdout=log,
                                              stderr=subprocess.STDOUT)
            self.speakers[node] = speaker
        deadline = time.monotonic() + READY_S
        for speaker in self.speakers.values():
            self._wait_ready(speaker, deadline)
        self._wait_adjacent(time.monotonic() + READY_S)

    def planned(self, node: str) -> dict[str, tuple[str, str]]:
        """{port: (system, port id)} the node's lldpd sees when the cabling is
        as planned: every cable whose far end runs an lldpd too."""
        plan, running = self.lab.plan, set(self.speakers)
        links = [(r.leaf, r.leaf_port, h.name, r.port) for h in plan.hosts for r in h.rails]
        links += [(u.leaf, u.leaf_port, u.spine, u.spine_port) for u in plan.uplinks]
        out = {}
        for a, a_port, b, b_port in links:
            for (here, port), far in (((a, a_port), (b, b_port)), ((b, b_port), (a, a_port))):
                if here == node and far[0] in running:
                    out[port] = far
        return out

    def _wait_adjacent(self, deadline: float) -> None:
        """Until every speaker sees its planned neighbours: lldpd sends its
        first frame one transmit interval after it starts, and a lab is
        built when a validation run against it can pass."""
        waiting = dict.fromkeys(self.speakers)
        while waiting:
            for node in list(waiting):
                seen = self.neighbours(node)
                if seen == self.planned(node):
                    del waiting[node]
                else:
                    waiting[node] = seen
            if waiting and time.monotonic() > deadline:
                raise LabError("lldp: neighbours not as planned after "
                               f"{READY_S:g}s: " + "; ".join(
                                   f"{n} sees {seen}, planned {self.planned(n)}"
                                   for n, seen in waiting.items()))
            if waiting:
                time.sleep(0.1)

    def _wait_ready(self, speaker: Speaker, deadline: float) -> None:
        while True:
            if speaker.proc is not None and speaker.proc.poll() is not None:
                raise LabError(f"{speaker.node}: lldpd exited with {speaker.proc.returncode}: "
                               f"{speaker.log_tail()}")
            name = self._system_name(speaker)
            if name == speaker.node:
                break
            if time.monotonic() > deadline:
                raise LabError(f"{speaker.node}: lldpd not ready after {READY_S:g}s (system "
                               f"name {name!r}); its log ends:\n{speaker.log_tail()}")
            time.sleep(0.1)
        # mnexec enters the namespace before it execs lldpd, so by now the PID
        # must sit in the node's namespace; anything else must never speak.
        assert speaker.proc is not None
        ino = os.stat(f"/proc/{speaker.proc.pid}/ns/net").st_ino
        if self.lab.netns_inodes.get(ino) != speaker.node:
            raise LabError(f"{speaker.node}: lldpd pid {speaker.proc.pid} is not in the "
                           f"node's network namespace")

    def _system_name(self, speaker: Speaker) -> str | None:
        proc = self.cli(speaker.node, "show", "chassis", check=False)
        if proc.returncode != 0:
            return None
        try:
            chassis = json.loads(proc.stdout)["local-chassis"][0]["chassis"][0]
            return chassis["name"][0]["value"]
        except (ValueError, KeyError, IndexError, TypeError):
            return None

    def speaker(self, node: str) -> Speaker:
        try:
            return self.speakers[node]
        except KeyError:
            raise LabError(f"no lldpd in {node!r} (lldpd runs in: {', '.join(self.speakers)}; "
                           "hosts only with lldp={'hosts': True})") from None

    def cli(self, node: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """``lldpcli -u <node's socket> -f json0 ARGS`` inside the node."""
        return self.lab.run(node, [LLDPCLI, "-u", self.speaker(node).socket, "-f", "json0",
                                   *args], check=check)

    def configure(self, node: str, *words: str) -> None:
        """``lldpcli configure WORDS`` on a running speaker, e.g.
        ``configure("lpl0", "lldp", "tx-interval", "5")``."""
        self.cli(node, "configure", *words)

    def neighbour_lists(self, node: str) -> dict[str, list[tuple[str, str, float]]]:
        proc = self.cli(node, "show", "neighbors")
        try:
            doc = json.loads(proc.stdout or "{}")
        except ValueError:
            raise LabError(f"{node}: lldpcli printed no JSON: {proc.stdout[:200]!r}") from None
        return parse_neighbours(doc)

    def neighbours(self, node: str) -> dict[str, tuple[str, str]]:
        """{local port: (system name, port id)}; where a port lists several
        neighbours (a re-patched cable before the old entry's TTL ends) the
        most recently seen one."""
        return {port: min(found, key=lambda n: n[2])[:2]
                for port, found in self.neighbour_lists(node).items()}


def _node_ports(lab: LabNodes, node: str) -> list[str]:
    """The node's lab interfaces by plan (lldpd's -I list)."""
    plan = lab.plan
    if node in plan.host_names:
        return [rail.port for rail in plan.host(node).rails]
    if node in plan.leaf_names:
        return plan.leaf_ports(node)
    return [u.spine_port for u in plan.uplinks if u.spine == node]


def sniff_lldp(pid: int, ifname: str, timeout_s: float) -> tuple[str, str] | None:
    """(system name, port id) of the first LLDP frame that *arrives* on
    ``ifname`` in the namespace of ``pid`` within ``timeout_s`` (None if
    none did), decoded by scapy: what a host without lldpd sees on the wire.
    Frames the node sends itself are skipped."""
    from scapy.contrib.lldp import LLDPDUPortID, LLDPDUSystemName
    from scapy.layers.l2 import Ether

    sock = socket_in_netns(pid, socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_LLDP))
    try:
        sock.bind((ifname, ETH_P_LLDP))
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                data, addr = sock.recvfrom(9000)
            except socket.timeout:
                return None
            if addr[2] == PACKET_OUTGOING:
                continue
            frame = Ether(data)
            if LLDPDUSystemName in frame and LLDPDUPortID in frame:
                return (frame[LLDPDUSystemName].system_name.decode(errors="replace"),
                        frame[LLDPDUPortID].id.decode(errors="replace")
                        if isinstance(frame[LLDPDUPortID].id, bytes)
                        else str(frame[LLDPDUPortID].id))
        return None
    finally:
        sock.close()
