"""FRR (zebra + bfdd, optionally bgpd) inside one lab namespace: the real BFD
peer a switch would be, and the eBGP-plus-BFD path tracking a fabric would run.

LAB.md's rules apply: the daemons run in the foreground, each started through
a *runner* prefix that enters the namespace and execs (so the PID we hold is
the daemon's) and stopped by that PID: ``netns_exec(name)`` (``ip netns exec``)
for a named namespace, ``mnexec_attach(pid)`` (``mnexec -a``) for a Mininet
node, whose namespace has no name. Every path they use (config, pid files, vty
sockets, the zserv socket, bfdd's control socket) lives in a private directory
owned by user ``frr``, so the system FRR service and /etc/frr are never
touched.  The directory is made with mkdtemp rather than under pytest's
tmp_path, whose 0700 root-owned parents user ``frr`` could not traverse once
FRR drops privileges.  (FRR itself still creates an empty /var/tmp/frr for
crash logs.)

bfdd needs zebra in the same namespace (interfaces come from zebra). 8.4 has no
``bfd`` on static routes, so sessions are configured as bfdd peers and read
back with ``show bfd peers json``.  Inline peer timers are limited; a profile
accepts intervals down to 10 ms, so peers always go through a profile.

bgpd (``bgp=BgpSpeaker(...)``) is how 8.4 tracks a path with BFD: one eBGP
session per path with ``bfd profile``, so bfdd's sessions are then created by
bgpd (through zebra) rather than configured as peers, and a session going
Down withdraws the routes learnt over it. bgpd listens on TCP 179 inside the
namespace and installs its best paths through zebra into the kernel (no
``--no_kernel``: that is the point).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

FRR_DIR = Path("/usr/lib/frr")
FRR_USER = "frr"
START_TIMEOUT_S = 20.0
VTYSH_TIMEOUT_S = 10.0


class FrrError(RuntimeError):
    pass


def netns_exec(name: str) -> tuple[str, ...]:
    """Runner for a named namespace (/run/netns/<name>)."""
    return ("ip", "netns", "exec", name)


def mnexec_attach(pid: int) -> tuple[str, ...]:
    """Runner for a Mininet node: its shell's PID names the namespaces. No
    ``-d``: for it mnexec forks when it leads its process group, and the PID
    we hold would then be a parent that has exited, not the daemon."""
    return ("mnexec", "-a", str(int(pid)))


@dataclass(frozen=True)
class BfdProfile:
    """A named set of BFD timers; named after them, so equal timers share one."""

    transmit_ms: int = 300
    receive_ms: int = 300
    detect_mult: int = 3
    passive: bool = False

    @property
    def name(self) -> str:
        return f"lp-{self.transmit_ms}-{self.receive_ms}-{self.detect_mult}" + \
            ("-passive" if self.passive else "")

    def lines(self) -> list[str]:
        out = [f" profile {self.name}", f"  transmit-interval {self.transmit_ms}",
               f"  receive-interval {self.receive_ms}", f"  detect-multiplier {self.detect_mult}"]
        if self.passive:
            out.append("  passive-mode")
        return out + [" !"]


@dataclass(frozen=True)
class BfdPeer:
    """One single-hop bfdd peer toward `peer`, from `local` on `ifname`."""

    peer: str
    local: str
    ifname: str
    transmit_ms: int = 300
    receive_ms: int = 300
    detect_mult: int = 3
    passive: bool = False

    @property
    def timers(self) -> BfdProfile:
        return BfdProfile(self.transmit_ms, self.receive_ms, self.detect_mult, self.passive)

    @property
    def profile(self) -> str:
        return self.timers.name


def bfdd_config(peers: Iterable[BfdPeer], profiles: Iterable[BfdProfile] = ()) -> str:
    """bfdd's config: the peers' profiles and ``profiles`` (for sessions
    another daemon creates, e.g. bgpd's ``bfd profile``), then the peers."""
    peers = list(peers)
    lines = ["bfd"]
    for profile in dict.fromkeys([*(p.timers for p in peers), *profiles]):
        lines += profile.lines()
    for p in peers:
        lines += [f" peer {p.peer} local-address {p.local} interface {p.ifname}",
                  f"  profile {p.profile}", " !"]
    lines.append("!")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class BgpNeighbor:
    """One single-hop eBGP session toward `address`, sourced from `local`
    (update-source, which also makes it the BFD session's local address).
    Routes accepted from it get `local_pref` (None: BGP's default, 100);
    `bfd`: track it with a BFD session with these timers."""

    address: str
    remote_as: int
    local: str
    local_pref: int | None = None
    bfd: BfdProfile | None = None


@dataclass(frozen=True)
class BgpSpeaker:
    """One bgpd: its AS, router id, neighbours and policy. It announces
    exactly `originate` (``network`` statements, import check off, so the
    prefix needs no covering route in the RIB) and accepts exactly the
    `accept` prefixes; everything else is denied both ways, so a speaker
    never passes on what it learnt. `connect_retry_s`: how soon a session
    that went down (or never came up) tries TCP again."""

    asn: int
    router_id: str
    neighbors: tuple[BgpNeighbor, ...]
    originate: tuple[str, ...] = ()
    accept: tuple[str, ...] = ()
    connect_retry_s: int = 1

    @property
    def profiles(self) -> list[BfdProfile]:
        return list(dict.fromkeys(n.bfd for n in self.neighbors if n.bfd is not None))


def _prefix_list(name: str, prefixes: Sequence[str]) -> list[str]:
    return [f"ip prefix-list {name} seq {5 * (k + 1)} permit {p}" for k, p in enumerate(prefixes)]


def _import_map(speaker: BgpSpeaker, n: BgpNeighbor) -> str:
    if not speaker.accept:
        return "lp-deny"
    return "lp-accept" if n.local_pref is None else f"lp-accept-pref{n.local_pref}"


def bgpd_config(speaker: BgpSpeaker, hostname: str = "lp-bgpd") -> str:
    """bgpd's config for `speaker`. Policy is explicit on every neighbour in
    both directions, which also satisfies eBGP's requires-policy default."""
    out = ["frr defaults traditional", f"hostname {hostname}", "!"]
    out += _prefix_list("lp-accept", speaker.accept)
    out += _prefix_list("lp-originate", speaker.originate)
    out += ["!", "route-map lp-deny deny 10", "!"]
    imports = dict.fromkeys((_import_map(speaker, n), n.local_pref) for n in speaker.neighbors)
    for name, pref in imports:
        if name == "lp-deny":
            continue
        out += [f"route-map {name} permit 10", " match ip address prefix-list lp-accept"]
        out += [f" set local-preference {pref}"] if pref is not None else []
        out.append("!")
    export = "lp-export" if speaker.originate else "lp-deny"
    if speaker.originate:
        out += ["route-map lp-export permit 10", " match ip address prefix-list lp-originate", "!"]
    out += [f"router bgp {speaker.asn}", f" bgp router-id {speaker.router_id}"]
    if speaker.originate:
        out.append(" no bgp network import-check")
    for n in speaker.neighbors:
        out += [f" neighbor {n.address} remote-as {n.remote_as}",
                f" neighbor {n.address} update-source {n.local}",
                f" neighbor {n.address} timers connect {speaker.connect_retry_s}",
                f" neighbor {n.address} advertisement-interval 0"]
        if n.bfd is not None:
            out.append(f" neighbor {n.address} bfd profile {n.bfd.name}")
    out += [" !", " address-family ipv4 unicast"]
    out += [f"  network {p}" for p in speaker.originate]
    for n in speaker.neighbors:
        out += [f"  neighbor {n.address} activate",
                f"  neighbor {n.address} route-map {_import_map(speaker, n)} in",
                f"  neighbor {n.address} route-map {export} out"]
    out += [" exit-address-family", "!"]
    return "\n".join(out) + "\n"


class FrrBfd:
    """zebra and bfdd in the named namespace `netns`, or wherever the argv
    prefix `runner` puts them (exactly one of the two), configured with `peers`
    (and `profiles`, for sessions bgpd creates); with `bgp` (or `bgpd_conf`),
    bgpd too; with ``bfdd=False`` no bfdd."""

    def __init__(self, netns: str | None, peers: Sequence[BfdPeer],
                 log_level: str = "informational", *, runner: Sequence[str] | None = None,
                 profiles: Sequence[BfdProfile] = (), bgp: BgpSpeaker | None = None,
                 zebra_conf: str = "", bgpd_conf: str | None = None, bfdd: bool = True):
        if (netns is None) == (runner is None):
            raise ValueError("give exactly one of netns and runner")
        if bgp is not None and bgpd_conf is not None:
            raise ValueError("give at most one of bgp and bgpd_conf")
        if not bfdd and (peers or profiles or (bgp is not None and bgp.profiles)):
            raise ValueError("BFD peers or profiles need bfdd")
        # bfdd=False: zebra (and bgpd) only, for a node whose BFD speaker is
        # something else (a host's linkpassd holds UDP 3784 there).
        self.run_bfdd = bfdd
        self.zebra_conf = zebra_conf  # appended to zebra's config
        self.bgpd_conf = bgpd_conf  # bgpd's whole config, written as given
        self.netns = netns
        self.runner: tuple[str, ...] = tuple(runner) if runner is not None else netns_exec(netns)
        self.peers_conf = tuple(peers)
        self.profiles = (*profiles, *(bgp.profiles if bgp else ()))
        self.bgp = bgp
        self.log_level = log_level
        self.dir: Path | None = None
        self.procs: dict[str, subprocess.Popen] = {}

    # ---- paths -------------------------------------------------------------

    def _path(self, *parts: str) -> Path:
        assert self.dir is not None, "FRR not started"
        return self.dir.joinpath(*parts)

    @property
    def run_dir(self) -> Path:
        return self._path("run")

    def _prepare(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="lp-frr-"))
        for sub in ("etc", "run", "log"):
            self._path(sub).mkdir()
        self._path("etc", "zebra.conf").write_text("hostname lp-zebra\n" + self.zebra_conf)
        self._path("etc", "bfdd.conf").write_text(bfdd_config(self.peers_conf, self.profiles))
        if self.bgp is not None:
            self._path("etc", "bgpd.conf").write_text(bgpd_config(self.bgp))
        elif self.bgpd_conf is not None:
            self._path("etc", "bgpd.conf").write_text(self.bgpd_conf)
        self._path("etc", "vtysh.conf").write_text("")
        for root, _dirs, files in os.walk(self.dir):
            shutil.chown(root, FRR_USER, FRR_USER)
            for name in files:
                shutil.chown(os.path.join(root, name), FRR_USER, FRR_USER)

    def _common(self, daemon: str) -> list[str]:
        return ["-f", str(self._path("etc", f"{daemon}.conf")),
                "-i", str(self._path("run", f"{daemon}.pid")),
                "-z", str(self._path("run", "zserv.api")),
                "--vty_socket", str(self.run_dir),
                "-P", "0",  # no TCP vty
                "-u", FRR_USER, "-g", FRR_USER,
                "--log", f"file:{self._path('log', daemon + '.log')}",
                "--log-level", self.log_level]

    def _spawn(self, daemon: str, extra: Sequence[str] = ()) -> None:
        out = open(self._path("log", f"{daemon}.out"), "ab")
        try:
            self.procs[daemon] = subprocess.Popen(
                [*self.runner, str(FRR_DIR / daemon),
                 *self._common(daemon), *extra],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
        finally:
            out.close()

    # ---- lifecycle ---------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT_S) -> FrrBfd:
        """Start zebra, then bfdd (and bgpd) once zebra's socket exists; return
        when bfdd answers on its vty with every configured peer (and bgpd
        answers on its own). Sessions may still be coming up. On failure,
        stop what was started and raise with the logs."""
        deadline = time.monotonic() + timeout
        self._prepare()
        try:
            self._spawn("zebra")
            self._wait(lambda: self._path("run", "zserv.api").exists(), deadline, "zebra socket")
            if self.run_bfdd:
                self._spawn("bfdd", ["--bfdctl", str(self._path("run", "bfdd.sock"))])
            if self.bgp is not None or self.bgpd_conf is not None:
                self._spawn("bgpd")
            wanted = {p.peer for p in self.peers_conf}
            self._wait(lambda: wanted <= {p.get("peer") for p in self._try_peers()}, deadline,
                       "bfdd peers")
            if self.bgp is not None:
                neighbors = {n.address for n in self.bgp.neighbors}
                self._wait(lambda: neighbors <= set(self.try_read(self.bgp_neighbors) or {}),
                           deadline, "bgpd neighbours")
            elif self.bgpd_conf is not None:
                self._wait(lambda: self.try_read(self.bgp_neighbors) is not None, deadline,
                           "bgpd vty")
        except BaseException:
            self.stop()
            raise
        return self

    def _wait(self, pred, deadline: float, what: str) -> None:
        while not pred():
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise FrrError(f"{name} exited with {proc.returncode}\n{self.logs()}")
            if time.monotonic() > deadline:
                raise FrrError(f"timed out waiting for {what}\n{self.logs()}")
            time.sleep(0.05)

    def stop(self, timeout: float = 10.0, daemons: Sequence[str] = ("bgpd", "bfdd", "zebra")) -> None:
        """SIGTERM each daemon by PID (bgpd, bfdd, then zebra; or only
        `daemons`), SIGKILL after `timeout`."""
        for name in daemons:
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def cleanup(self) -> None:
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> FrrBfd:
        return self.start()

    def __exit__(self, *exc) -> None:
        try:
            self.stop()
        finally:
            self.cleanup()

    # ---- reading state -----------------------------------------------------

    def vtysh(self, *commands: str, timeout: float = VTYSH_TIMEOUT_S) -> str:
        args = [*self.runner, "vtysh", "--vty_socket", str(self.run_dir),
                "--config_dir", str(self._path("etc"))]
        for c in commands:
            args += ["-c", c]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise FrrError(f"vtysh {commands}: rc={proc.returncode} {proc.stderr.strip()}")
        return proc.stdout

    @staticmethod
    def try_read(read):
        """A vtysh reading, or None while the daemon cannot answer yet."""
        try:
            return read()
        except (FrrError, ValueError, subprocess.TimeoutExpired):
            return None

    def _try_peers(self) -> list[dict]:
        return self.try_read(self.bfd_peers) or []

    def bfd_peers(self) -> list[dict]:
        out = self.vtysh("show bfd peers json")
        return json.loads(out) if out.strip() else []

    def bfd_peer(self, peer: str) -> dict | None:
        return next((p for p in self.bfd_peers() if p.get("peer") == peer), None)

    def bgp_neighbors(self) -> dict[str, dict]:
        """``show bgp neighbors json``: neighbour address -> its state
        (``bgpState``, ``bfdInfo``...)."""
        if self.bgp is None and self.bgpd_conf is None:
            raise FrrError("this FRR runs no bgpd")
        out = json.loads(self.vtysh("show bgp neighbors json"))
        if not isinstance(out, dict):
            raise ValueError(f"unexpected show bgp neighbors json: {out!r}")
        return out

    def bgp_states(self) -> dict[str, str]:
        """Neighbour address -> BGP FSM state (``Established``, ``Active``...)."""
        return {addr: info.get("bgpState", "?") for addr, info in self.bgp_neighbors().items()}

    def logs(self) -> str:
        if self.dir is None or not self._path("log").exists():
            return ""
        parts = []
        for f in sorted(self._path("log").iterdir()):
            text = f.read_text(errors="replace")
            parts.append(f"--- {f.name}\n{text[-4000:]}")
        return "\n".join(parts)
