"""Run a real linkpassd inside a lab namespace, and stop exactly that process.

Used by the netns tests and the benchmarks: the daemon runs as its own
process (as in production), is watched through `linkpassctl -o json`, and is
stopped by PID only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterable, Sequence


def rail_config_toml(socket_path: str, run_dir: str, rails: Iterable, *, rise: int = 2,
                     hold_down_s: float = 1.0, tick_interval_s: float = 0.1,
                     multipath: str | None = "198.18.128.0/17", buckets: int = 8,
                     log_level: str = "info", extra: str = "", bfd: bool = False,
                     probe_peers: Sequence[Sequence[str]] = (),
                     multipath_rails: Sequence[int] | None = None,
                     daemon_extra: str = "", state_dir: str | None = None) -> str:
    """A linkpassd config for rails with .port/.address/.gateway/.prefixlen;
    every rail backs up the others, in order. `extra` is more TOML (sections);
    `probe_peers[i]` are rail i's echo peers (`[probes]` goes in `extra`);
    the multipath group spans `multipath_rails` (indexes; default: all);
    `daemon_extra` is more `[daemon]` keys; `state_dir` defaults to
    `<run_dir>/state`."""
    rails = list(rails)
    names = [f"rail{i}" for i in range(len(rails))]
    out = [
        "[daemon]",
        f'control_socket = "{socket_path}"',
        f'run_dir = "{run_dir}"',
        f'state_dir = "{state_dir or f"{run_dir}/state"}"',
        f'log_level = "{log_level}"',
        *([daemon_extra.strip()] if daemon_extra.strip() else []),
        "[timers]",
        f"rise = {rise}",
        f"hold_down_s = {hold_down_s}",
        f"tick_interval_s = {tick_interval_s}",
    ]
    for i, (name, rail) in enumerate(zip(names, rails)):
        backups = ", ".join(f'"{n}"' for n in names if n != name)
        out += ["[[rail]]", f'name = "{name}"', f'port = "{rail.port}"',
                f'address = "{rail.address}/{rail.prefixlen}"', f'gateway = "{rail.gateway}"',
                f"backups = [{backups}]"] + (["bfd = true"] if bfd else [])
        peers = probe_peers[i] if i < len(probe_peers) else ()
        if peers:
            out.append("probe_peers = [" + ", ".join(f'"{p}"' for p in peers) + "]")
    if extra:
        out.append(extra.strip())
    if multipath:
        chosen = range(len(names)) if multipath_rails is None else multipath_rails
        members = ", ".join(f'"{names[i]}"' for i in chosen)
        out += ["[[multipath]]", 'name = "fabric"', f'destination = "{multipath}"',
                f"rails = [{members}]", f"buckets = {buckets}"]
    return "\n".join(out) + "\n"


def ctl_status(socket_path: str) -> dict | None:
    """`linkpassctl status -o json`, or None while the daemon does not answer."""
    ctl = [sys.executable, "-m", "linkpassd.ctl.main", "--socket", socket_path,
           "--timeout", "2", "status", "-o", "json"]
    proc = subprocess.run(ctl, capture_output=True, text=True, timeout=10)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def assessment(status: dict | None, port: str, signal: str) -> dict:
    """One health signal's judgement of a port in a `status -o json` ({} if absent)."""
    for ps in (status or {}).get("sensors", []):
        if ps["port"] == port:
            return next((a for a in ps["assessments"] if a["signal"] == signal), {})
    return {}


def wait_ready(proc: subprocess.Popen, socket_path: str, log_path: Path,
               timeout: float = 20.0) -> dict:
    """Until the daemon's first reconcile has completed; fails loudly with its log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"linkpassd exited with {proc.returncode}:\n"
                               f"{Path(log_path).read_text(errors='replace')}")
        st = ctl_status(socket_path)
        if st and int(st.get("reconciles", 0)) >= 1:
            return st
        time.sleep(0.1)
    raise TimeoutError(f"linkpassd not ready after {timeout}s:\n"
                       f"{Path(log_path).read_text(errors='replace')}")


class DaemonProcess:
    """`env` adds to the daemon's environment (e.g. systemd's NOTIFY_SOCKET and
    WATCHDOG_USEC); `program` replaces `python -m linkpassd.daemon` with an argv
    prefix that takes the same `--config FILE` (a test harness around Daemon)."""

    def __init__(self, netns: str, config_path: Path, socket_path: str, log_path: Path, *,
                 env: dict[str, str] | None = None, program: Sequence[str] | None = None):
        self.netns = netns
        self.config_path = Path(config_path)
        self.socket_path = socket_path
        self.log_path = Path(log_path)
        self.env = dict(env or {})
        self.program = list(program or [sys.executable, "-m", "linkpassd.daemon"])
        self.proc: subprocess.Popen | None = None

    def start(self) -> "DaemonProcess":
        log = open(self.log_path, "ab")
        # `ip netns exec` execs the command, so the PID we hold is the daemon's.
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.netns, *self.program, "--config", str(self.config_path)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **self.env} if self.env else None)
        log.close()
        return self

    def status(self) -> dict | None:
        return ctl_status(self.socket_path)

    def wait_ready(self, timeout: float = 20.0) -> dict:
        assert self.proc is not None, "start() first"
        return wait_ready(self.proc, self.socket_path, self.log_path, timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        os.kill(self.proc.pid, sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(5)

    def __enter__(self) -> "DaemonProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
