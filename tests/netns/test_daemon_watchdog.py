"""systemd's watchdog against a real linkpassd in a lab namespace.

The test plays systemd: it binds the NOTIFY_SOCKET datagram socket and sets
WATCHDOG_USEC. The daemon runs in tests/netns/_blocking_daemon.py (the real
Daemon, plus a way for the test to block its event loop, or to hold its
reconcile loop in one await while the event loop runs on). WATCHDOG=1 must
arrive regularly, stop for as long as either is stuck, and resume after.
A ping sent from a thread would go on through the blocked event loop; a
ping sent from a timer that ignores progress would go on through the stalled
reconcile loop: either fails this test.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from labs.daemonproc import DaemonProcess, rail_config_toml
from labs.netnslib import wait_for_sync

pytestmark = pytest.mark.netns

HARNESS = Path(__file__).with_name("_blocking_daemon.py")
WATCHDOG_S = 2.0  # WATCHDOG_USEC: a ping is due every 1 s
PERIOD_S = WATCHDOG_S / 2
STUCK_S = 4.0  # twice WatchdogSec: systemd would have killed it
READ_SLACK_S = 0.3  # our reader thread may see a datagram late on a busy machine


class NotifyListener:
    """The systemd side of sd_notify: a datagram socket, read on a thread,
    every message stamped on arrival (CLOCK_MONOTONIC)."""

    def __init__(self) -> None:
        # A short path: sun_path holds 108 bytes. Not an abstract socket:
        # those belong to one network namespace, and the daemon is in another.
        self.dir = tempfile.mkdtemp(prefix="lp-notify-")
        self.path = os.path.join(self.dir, "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.1)
        self.received: list[tuple[float, str]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._read, name="notify-listener", daemon=True)

    def _read(self) -> None:
        while not self.stop.is_set():
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                continue
            with self.lock:
                self.received.append((time.monotonic(), data.decode(errors="replace")))

    def pings(self) -> list[float]:
        with self.lock:
            return [t for t, msg in self.received if "WATCHDOG=1" in msg.splitlines()]

    def messages(self) -> list[str]:
        with self.lock:
            return [msg for _, msg in self.received]

    def __enter__(self) -> "NotifyListener":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def request(control: Path, action: str, seconds: float) -> None:
    tmp = control / "request.tmp"
    tmp.write_text(json.dumps({"action": action, "seconds": seconds}))
    tmp.rename(control / "request.json")  # the harness never reads half a request


def stamp(control: Path, action: str, phase: str) -> float | None:
    path = control / "stamps.jsonl"
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row["action"] == action and row["phase"] == phase:
            return row["t"]
    return None


def test_watchdog_pings_only_while_the_event_loop_and_the_reconcile_loop_progress(lab, tmp_path):
    control = tmp_path / "control"
    control.mkdir()
    cfg = tmp_path / "linkpassd.toml"
    sock = str(tmp_path / "ctl.sock")
    cfg.write_text(rail_config_toml(sock, str(tmp_path), lab.rails, tick_interval_s=0.1))
    with NotifyListener() as notify:
        daemon = DaemonProcess(
            lab.host.name, cfg, sock, tmp_path / "linkpassd.log",
            env={"NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": str(int(WATCHDOG_S * 1e6))},
            program=[sys.executable, str(HARNESS), "--control", str(control)])
        with daemon:
            daemon.wait_ready()
            wait_for_sync(lambda: "READY=1" in notify.messages(), 10.0, "READY=1")

            # Healthy: a ping every period, never a gap systemd would act on.
            wait_for_sync(lambda: len(notify.pings()) >= 4, 15.0, "four watchdog pings")
            pings = notify.pings()
            gaps = [b - a for a, b in zip(pings, pings[1:])]
            assert max(gaps) < WATCHDOG_S, f"pings too far apart: {gaps}\n{daemon.log()}"

            for action, pings_may_go_on_s in (("block-loop", 0.0), ("stall-reconcile", PERIOD_S)):
                request(control, action, STUCK_S)
                start = wait_for_sync(lambda action=action: stamp(control, action, "start"), 10.0,
                                      f"{action} to start")
                if action == "stall-reconcile":
                    # The event loop runs on (the control socket answers), only
                    # the reconcile loop is stuck.
                    assert daemon.status() is not None, daemon.log()
                end = wait_for_sync(lambda action=action: stamp(control, action, "end"), STUCK_S + 15.0,
                                    f"{action} to end")
                assert end - start >= STUCK_S * 0.95
                # Pings resume once the loops run again...
                wait_for_sync(lambda end=end: len([t for t in notify.pings() if t > end]) >= 2,
                              4 * WATCHDOG_S, f"pings to resume after {action}")
                # ...and none came while stuck. The reconcile loop's last batch
                # before the stall may still earn the next ping (one period).
                silent_from = start + pings_may_go_on_s + READ_SLACK_S
                during = [round(t - start, 3) for t in notify.pings() if silent_from < t < end]
                assert during == [], (f"{action}: WATCHDOG=1 at {during} s into a "
                                      f"{end - start:.1f} s stall\n{daemon.log()}")
            assert daemon.stop() == 0
    log = daemon.log()
    # The stalled reconcile loop is logged (the event loop runs on to say so).
    # A blocked event loop may not be: when it wakes, a reconcile batch that
    # was already due can finish before the watchdog's check, which then sees
    # fresh progress; no ping went out during the block either way (above).
    assert "watchdog_withheld" in log and "watchdog_resumed" in log, log
