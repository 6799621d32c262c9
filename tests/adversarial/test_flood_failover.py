"""Issue 30, "must show": while a local user floods linkpassd's metrics
endpoint and control socket with idle connections, a cable pull still moves
the rail's traffic within its usual time, and the daemon still answers.

A real linkpassd in a lab namespace (netns: root, run under the lab lock)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from labs.daemonproc import DaemonProcess, rail_config_toml
from labs.netnslib import HostLab, NetnsFactory, wait_for_sync

pytestmark = pytest.mark.netns

NH1 = 1_000_101
RAIL0_TABLE = 10100
METRICS_PORT = 9469
FLOOD = 300
FAILOVER_S = 1.0  # a carrier failover takes milliseconds (docs/measured.md); 1 s bounds it with room for a busy CI
# Opens FLOOD connections to the metrics endpoint from inside the namespace and holds them.
_HOLD = ("import socket, sys, time\n"
         "socks = []\n"
         "for _ in range(int(sys.argv[1])):\n"
         "    try: socks.append(socket.create_connection(('127.0.0.1', int(sys.argv[2])), timeout=2))\n"
         "    except OSError: pass\n"
         "print(len(socks), flush=True)\n"
         "sys.stdin.read()\n")


@pytest.fixture
def lab():
    import os
    if os.geteuid() != 0:
        pytest.skip("needs root to create network namespaces")
    factory = NetnsFactory()
    try:
        yield HostLab.build(factory, n_rails=2)
    finally:
        errors = factory.cleanup()
        assert not errors, f"namespace teardown failed: {errors}"


def _route_nhid(lab: HostLab, table: int) -> int | None:
    for route in lab.host.ipj("route", "show", "table", str(table)):
        if route["dst"] == "default":
            return route.get("nhid")
    return None


def test_a_cable_pull_moves_traffic_while_the_endpoints_are_flooded(lab: HostLab) -> None:
    run_dir = Path(tempfile.mkdtemp(prefix="lp-fl-", dir="/tmp"))
    lab.host.ip("link", "set", "lo", "up")
    cfg, sock = run_dir / "linkpassd.toml", str(run_dir / "ctl.sock")
    cfg.write_text(rail_config_toml(sock, str(run_dir), lab.rails, rise=1, hold_down_s=0.5,
                                    tick_interval_s=0.1, extra=f'[metrics]\nlisten = "127.0.0.1:{METRICS_PORT}"\n'))
    holder = None
    control_socks: list[socket.socket] = []
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, run_dir, True)
        daemon = stack.enter_context(DaemonProcess(lab.host.name, cfg, sock, run_dir / "linkpassd.log"))
        daemon.wait_ready()
        holder = subprocess.Popen(["ip", "netns", "exec", lab.host.name, sys.executable, "-c", _HOLD,
                                   str(FLOOD), str(METRICS_PORT)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        stack.callback(lambda: (holder.stdin.close(), holder.wait(10)))
        assert int(holder.stdout.readline()) > 16  # far past the endpoint's cap
        for _ in range(100):  # and the control socket's (64)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            with contextlib.suppress(OSError):
                s.connect(sock)
            control_socks.append(s)
        stack.callback(lambda: [s.close() for s in control_socks])
        time.sleep(0.5)
        t0 = time.monotonic()
        lab.cut(lab.rails[0])
        try:
            wait_for_sync(lambda: _route_nhid(lab, RAIL0_TABLE) == NH1, 5.0, "failover under flood")
            took = time.monotonic() - t0
        finally:
            lab.restore(lab.rails[0])
        assert took < FAILOVER_S, f"the failover took {took:.3f} s under the flood"
        # the daemon still answers its admins (root) over the flooded control socket
        for s in control_socks:
            s.close()
        control_socks.clear()
        status = subprocess.run([sys.executable, "-m", "linkpassd.ctl.main", "--socket", sock, "--timeout", "5",
                                 "status"], capture_output=True, text=True, timeout=20)
        assert status.returncode == 0, status.stderr
        print(f"\nfailover under a flood of {FLOOD} metrics and 100 control connections: {took * 1000:.0f} ms")
