"""FRR (zebra + bfdd) inside one lab namespace: the real BFD peer a switch would be.

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
    def profile(self) -> str:
        return f"lp-{self.transmit_ms}-{self.receive_ms}-{self.detect_mult}" + \
            ("-passive" if self.passive else "")


def bfdd_config(peers: Iterable[BfdPeer]) -> str:
    peers = list(peers)
    lines = ["bfd"]
    for profile in dict.fromkeys(p.profile for p in peers):
        p = next(x for x in peers if x.profile == profile)
        lines += [f" profile {profile}", f"  transmit-interval {p.transmit_ms}",
                  f"  receive-interval {p.receive_ms}", f"  detect-multiplier {p.detect_mult}"]
        if p.passive:
            lines.append("  passive-mode")
        lines.append(" !")
    for p in peers:
        lines += [f" peer {p.peer} local-address {p.local} interface {p.ifname}",
                  f"  profile {p.profile}", " !"]
    lines.append("!")
    return "\n".join(lines) + "\n"


class FrrBfd:
    """zebra and bfdd in the named namespace `netns`, or wherever the argv
    prefix `runner` puts them (exactly one of the two), configured with `peers`."""

    def __init__(self, netns: str | None, peers: Sequence[BfdPeer],
                 log_level: str = "informational", *, runner: Sequence[str] | None = None):
        if (netns is None) == (runner is None):
            raise ValueError("give exactly one of netns and runner")
        self.netns = netns
        self.runner: tuple[str, ...] = tuple(runner) if runner is not None else netns_exec(netns)
        self.peers_conf = tuple(peers)
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
        self._path("etc", "zebra.conf").write_text("hostname lp-zebra\n")
        self._path("etc", "bfdd.conf").write_text(bfdd_config(self.peers_conf))
        self._path("etc", "vtysh.conf").write_text("")
        for root, dirs, files in os.walk(self.dir):
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
        """Start zebra, then bfdd once zebra's socket exists; return when bfdd
        answers on its vty with every configured peer. On failure, stop what
        was started and raise with the logs."""
        deadline = time.monotonic() + timeout
        self._prepare()
        try:
            self._spawn("zebra")
            self._wait(lambda: self._path("run", "zserv.api").exists(), deadline, "zebra socket")
            self._spawn("bfdd", ["--bfdctl", str(self._path("run", "bfdd.sock"))])
            wanted = {p.peer for p in self.peers_conf}
            self._wait(lambda: wanted <= {p.get("peer") for p in self._try_peers()}, deadline,
                       "bfdd peers")
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

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM each daemon by PID (bfdd first), SIGKILL after `timeout`."""
        for name in ("bfdd", "zebra"):
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

    def _try_peers(self) -> list[dict]:
        try:
            return self.bfd_peers()
        except (FrrError, ValueError, subprocess.TimeoutExpired):
            return []

    def bfd_peers(self) -> list[dict]:
        out = self.vtysh("show bfd peers json")
        return json.loads(out) if out.strip() else []

    def bfd_peer(self, peer: str) -> dict | None:
        return next((p for p in self.bfd_peers() if p.get("peer") == peer), None)

    def logs(self) -> str:
        if self.dir is None or not self._path("log").exists():
            return ""
        parts = []
        for f in sorted(self._path("log").iterdir()):
            text = f.read_text(errors="replace")
            parts.append(f"--- {f.name}\n{text[-4000:]}")
        return "\n".join(parts)
