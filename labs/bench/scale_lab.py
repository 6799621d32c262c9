"""The lab behind labs/bench/probe_scale: one host with two rails, a leaf
namespace holding as many probe peers as wanted, and the processes a bench
cell runs there (linkpassd, an echo responder, FRR bfdd on both sides).

    host ns  lprail<r> 198.18.<r>.2/24  <->  leaf ns lpleaf<r> 198.18.<r>.1/24
             (netnslib.HostLab)                + 198.18.<r>.<10+k>/24   bfdd peers k (multihop)
                                               lo 198.19.<10+r>.<1+k>/32 echo peers k of rail r
                                               lo 198.19.12.1/32        the blackout flow's sink

Many peers live on one namespace's loopback: each is a distinct address, so
linkpassd runs one probe path per (rail, peer) exactly as against distinct
hosts, and bfdd runs one multihop session per (rail, leaf address). Every
process is started here, held by PID and stopped by PID; the namespaces are
deleted by name on exit.

The peers' responder is labs/echopeer with --no-rate-limit: one host probing
128 peers every 10 ms sends 12,800 requests a second from one rail address,
which the default limit (5,000/s per source) would partly refuse.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from labs.daemonproc import DaemonProcess, rail_config_toml
from labs.echopeer import _readline
from labs.frr import BfdPeer, FrrBfd
from labs.netnslib import HostLab, NetnsFactory
from labs.routewatch import READY_TIMEOUT_S, RouteChange, RouteWatch
from labs.topos.nl import LinkSetter

REPO = Path(__file__).resolve().parents[2]
N_RAILS = 2
MAX_PEERS_PER_RAIL = 128
FLOW_SINK = "198.19.12.1"
METRICS_ADDR = "127.0.0.1:9469"
BLACKHOLE_GROUP = 0x4C50_0F00  # interface group that arms the blackhole's drop rules
NFT_TABLE = "lp_scale_fault"
NO_DAMPENING = """
[health]
flap_penalty = 1.0
flap_suppress = 10000.0
flap_max_penalty = 10000.0
"""


def echo_peer(rail: int, k: int) -> str:
    return f"198.19.{10 + rail}.{1 + k}"


def bfd_leaf_address(rail: int, k: int) -> str:
    return f"198.18.{rail}.{10 + k}"


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text exposition -> (name, labels, value); enough for our own output."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, labels = head, {}
        if "{" in head:
            name, _, body = head.partition("{")
            for part in body.rstrip("}").split('",'):
                if "=" in part:
                    k, _, v = part.partition("=")
                    labels[k.strip(",")] = v.strip('"')
        try:
            out.append((name, labels, float(value)))
        except ValueError:
            continue
    return out


class ScaleLab:
    """Namespaces and addresses for `peers_per_rail` echo peers and bfdd peers
    per rail; processes are started by the methods below and all stopped on exit."""

    def __init__(self, peers_per_rail: int, workdir: Path | None = None):
        if not 1 <= peers_per_rail <= MAX_PEERS_PER_RAIL:
            raise ValueError(f"peers_per_rail must be 1..{MAX_PEERS_PER_RAIL}, got {peers_per_rail}")
        self.peers_per_rail = peers_per_rail
        self.factory = NetnsFactory()
        self._own_dir = workdir is None  # ours to remove at exit
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="lp-scale-"))
        self.lab: HostLab | None = None
        self.daemon: DaemonProcess | None = None
        self.responder: subprocess.Popen | None = None
        self.frr: list[FrrBfd] = []
        self._pinner: subprocess.Popen | None = None
        self._setter: LinkSetter | None = None
        self._fault_armed = False

    # ---- build and teardown ------------------------------------------------

    def __enter__(self) -> "ScaleLab":
        try:
            self.lab = HostLab.build(self.factory, N_RAILS)
            leaf = self.lab.leaf
            batch = [f"address add {FLOW_SINK}/32 dev lo"]
            for r in range(N_RAILS):
                for k in range(self.peers_per_rail):
                    batch.append(f"address add {echo_peer(r, k)}/32 dev lo")
                    batch.append(f"address add {bfd_leaf_address(r, k)}/24 dev lpleaf{r}")
            proc = subprocess.run(["ip", "-n", leaf.name, "-batch", "-"], input="\n".join(batch),
                                  text=True, capture_output=True, timeout=30)
            if proc.returncode != 0:
                raise RuntimeError(f"ip -batch in {leaf.name}: {proc.stderr.strip()}")
            # After a failover the host's rail-0 traffic arrives on lpleaf1.
            for key in ("all", "default", *(f"lpleaf{r}" for r in range(N_RAILS))):
                self.sysctl(leaf.name, f"net.ipv4.conf.{key}.rp_filter=0")
            # LinkSetter enters a namespace through a PID in it: a sleeper we own.
            self._pinner = subprocess.Popen(["ip", "netns", "exec", leaf.name, "sleep", "7200"],
                                            stdin=subprocess.DEVNULL)
            time.sleep(0.05)  # let `ip netns exec` exec into sleep before we open its netns
            self._setter = LinkSetter(self._pinner.pid, leaf.name)
            self._arm_blackhole()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        errors = []
        for stop in (self.stop_linkpassd, self.stop_frr, self.stop_responder):
            try:
                stop()
            except Exception as e:  # noqa: BLE001 - keep tearing down
                errors.append(repr(e))
        if self._setter is not None:
            self._setter.close()
            self._setter = None
        if self._pinner is not None:
            _stop_proc(self._pinner)
            self._pinner = None
        errors += self.factory.cleanup()
        if errors:
            print(f"scale lab teardown: {errors}", file=sys.stderr)
        elif self._own_dir:  # the daemon logs go with it; kept when teardown failed
            shutil.rmtree(self.dir, ignore_errors=True)

    @staticmethod
    def sysctl(ns: str, assignment: str) -> None:
        subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", assignment], check=True,
                       timeout=10, capture_output=True)

    @property
    def host(self) -> str:
        return self.lab.host.name

    @property
    def leaf(self) -> str:
        return self.lab.leaf.name

    def peers(self, rail: int) -> list[str]:
        return [echo_peer(rail, k) for k in range(self.peers_per_rail)]

    @property
    def paths(self) -> int:
        return N_RAILS * self.peers_per_rail

    # ---- echo responder (the peers' side of linkpassd's probes) -------------

    def start_responder(self, duration_s: float = 3600) -> int:
        self.responder = subprocess.Popen(
            ["ip", "netns", "exec", self.leaf, sys.executable, "-m", "labs.echopeer",
             "--no-rate-limit", "--duration", f"{duration_s:g}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=os.getcwd())
        line = _readline(self.responder, 10.0)
        if '"ready"' not in line:
            _stop_proc(self.responder)
            raise RuntimeError(f"responder did not start: {line!r} {self.responder.stderr.read()}")
        return self.responder.pid

    def stop_responder(self) -> None:
        if self.responder is not None:
            _stop_proc(self.responder)
            self.responder = None

    # ---- linkpassd --------------------------------------------------------

    def start_linkpassd(self, interval_ms: float, tag: str = "lp") -> DaemonProcess:
        run_dir = self.dir / tag
        run_dir.mkdir(parents=True, exist_ok=True)
        sock = str(run_dir / "ctl.sock")
        probes = f"[probes]\nenabled = true\ninterval_ms = {interval_ms:g}\n"
        metrics = f'[metrics]\nlisten = "{METRICS_ADDR}"\n'
        cfg = run_dir / "linkpassd.toml"
        cfg.write_text(rail_config_toml(sock, str(run_dir), self.lab.rails, rise=2,
                                        hold_down_s=1.0, extra=probes + metrics + NO_DAMPENING,
                                        probe_peers=[self.peers(r) for r in range(N_RAILS)]))
        self.daemon = DaemonProcess(self.host, cfg, sock, run_dir / "linkpassd.log")
        self.daemon.start()
        self.daemon.wait_ready(30.0)
        return self.daemon

    def stop_linkpassd(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()
            self.daemon = None

    def metrics(self) -> list[tuple[str, dict[str, str], float]]:
        proc = subprocess.run(["ip", "netns", "exec", self.host, "curl", "-sf", "--max-time", "5",
                               f"http://{METRICS_ADDR}/metrics"],
                              capture_output=True, text=True, timeout=10)
        return parse_metrics(proc.stdout) if proc.returncode == 0 else []

    def probe_states(self) -> dict[str, int]:
        """How many probe paths are in each state (empty while /metrics does not answer)."""
        states: dict[str, int] = {}
        for name, labels, value in self.metrics():
            if name == "linkpass_probe_path_state" and value == 1:
                states[labels.get("state", "?")] = states.get(labels.get("state", "?"), 0) + 1
        return states

    def wait_probes_up(self, timeout: float = 60.0) -> None:
        wait(lambda: self.probe_states().get("UP", 0) == self.paths, timeout,
             f"all {self.paths} probe paths UP", lambda: f"states {self.probe_states()}")

    # ---- FRR bfdd on both sides -------------------------------------------

    def start_frr(self, interval_ms: int, detect_mult: int = 3, *,
                  wait_up: bool = True) -> tuple[int, int]:
        """bfdd in the host with one multihop session per (rail, leaf
        address), answered by bfdd in the leaf (see MultihopBfd). Returns
        (host bfdd PID, leaf bfdd PID), with `wait_up` once every session is up."""
        t = dict(transmit_ms=interval_ms, receive_ms=interval_ms, detect_mult=detect_mult)
        host_peers, leaf_peers = [], []
        for r in range(N_RAILS):
            for k in range(self.peers_per_rail):
                host_peers.append(BfdPeer(bfd_leaf_address(r, k), f"198.18.{r}.2", f"lprail{r}", **t))
                leaf_peers.append(BfdPeer(f"198.18.{r}.2", bfd_leaf_address(r, k), f"lpleaf{r}", **t))
        for ns, peers in ((self.host, host_peers), (self.leaf, leaf_peers)):
            frr = MultihopBfd(ns, peers, log_level="warnings")
            self.frr.append(frr)
            frr.start()
        if wait_up:
            self.wait_bfd_up(60.0)
        return self.frr[0].procs["bfdd"].pid, self.frr[1].procs["bfdd"].pid

    def bfd_up(self) -> int:
        host = self.frr[0]
        return sum(p.get("status") == "up" for p in host.try_read(host.bfd_peers) or [])

    def wait_bfd_up(self, timeout: float = 60.0) -> None:
        wait(lambda: self.bfd_up() == self.paths, timeout, f"all {self.paths} BFD sessions up",
             lambda: f"({self.bfd_up()} up)")

    def stop_frr(self) -> None:
        while self.frr:
            frr = self.frr.pop()
            try:
                frr.stop()
            finally:
                frr.cleanup()

    # ---- a silent blackhole on rail 0, leaf side -----------------------------

    def _arm_blackhole(self) -> None:
        """Drop rules on lpleaf0 both ways, armed but matching nothing until
        the port's interface group is BLACKHOLE_GROUP (as labs/faults/nft.py):
        inject/clear are one netlink request each, stamped right before."""
        lines = [f"add table netdev {NFT_TABLE}"]
        for hook, match in (("ingress", "iifgroup"), ("egress", "oifgroup")):
            lines += [f'add chain netdev {NFT_TABLE} bh_{hook} {{ type filter hook {hook} '
                      f'device "lpleaf0" priority 0; policy accept; }}',
                      f"add rule netdev {NFT_TABLE} bh_{hook} meta {match} {BLACKHOLE_GROUP} "
                      f"counter drop"]
        self.lab.leaf.nft("\n".join(lines) + "\n")

    def blackhole(self, on: bool) -> float:
        """Start (on) or end the silent blackhole on rail 0; the monotonic stamp."""
        return self._setter.set("lpleaf0", group=BLACKHOLE_GROUP if on else 0)

    def route_watch(self, dst: str, src: str, duration_s: float = 3600) -> RouteWatch:
        argv = ["ip", "netns", "exec", self.host, sys.executable, "-m", "labs.routewatch",
                "--dst", dst, "--src", src, "--duration", f"{duration_s:g}"]
        log_path = self.dir / "routewatch.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True,
                                    bufsize=1, cwd=os.getcwd())
        watch = RouteWatch(proc, self.host, log_path)
        watch.initial = RouteChange.of(watch.lines.wait(lambda e: e["event"] == "ready",
                                                        READY_TIMEOUT_S, "ready"))
        return watch


class MultihopBfd(FrrBfd):
    """FrrBfd whose peers are multihop sessions (RFC 5883), keyed by (peer,
    local address): bfdd keys a single-hop session by (peer, interface)
    only, so the leaf could hold just one session toward the host's rail
    address. Multihop is also what echo probing is, a session to an address
    behind the gateway; on one link it costs the same per packet."""

    def _prepare(self) -> None:
        super()._prepare()
        lines = ["bfd"]
        for profile in dict.fromkeys(p.timers for p in self.peers_conf):
            lines += profile.lines()
        for p in self.peers_conf:
            lines += [f" peer {p.peer} multihop local-address {p.local}",
                      f"  profile {p.profile}", " !"]
        self._path("etc", "bfdd.conf").write_text("\n".join(lines + ["!"]) + "\n")


def wait(pred, timeout: float, what: str, detail=lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what} {detail()}")
        time.sleep(0.2)


def _stop_proc(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
