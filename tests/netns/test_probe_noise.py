"""Probing must never fail a path over on noise: random loss on a healthy path,
or a machine whose CPUs are all busy. A false failover costs as much as a
missed one, so both run long enough for rare events to show.

Fencing ([fence], at its strictest fence_after_s) is on throughout and must never act.

The leaf namespace holds the peer address and an echo responder (as in
test_daemon_echo); linkpassd probes it from both rails. Every test checks that
the noise really reached the probes (suspicions raised, probes answered),
so a test whose noise silently failed to apply cannot pass.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from labs.daemonproc import assessment
from labs.echopeer import EchoPeerProcess
from labs.netnslib import wait_for_sync

pytestmark = pytest.mark.netns

NH0, NH1 = 1_000_100, 1_000_101


def failovers(log: str) -> list[str]:
    """Every verdict other than UP and every rail path other than its own."""
    bad = [line for line in log.splitlines()
           if (" event=port_verdict " in line and " verdict=UP" not in line)
           or (" event=rail_path " in line
               and re.search(r" path=(\w+) .*\brail=\1(?: |$)", line) is None)]
    return bad


def fence_events(log: str) -> list[str]:
    """Fences, tests and held-back fences ([fence] is on in these tests)."""
    return [line for line in log.splitlines() if re.search(r" event=fence_(?!write)", line)]


def suspicions(log: str) -> list[int]:
    """Suspicions (silences) raised per path, from the counters the daemon logs when it stops."""
    return [int(m.group(1)) for m in re.finditer(r" event=echo_counters .*\bsilences=(\d+)", log)]




INTERVALS = 10_000
LOSS_INTERVAL_MS = 10


def test_five_percent_random_loss_over_ten_thousand_intervals_fails_nothing_over(lab, echo_daemon):
    """5 % loss each way on both rails (an exchange is lost ~9.75 % of the time):
    about a thousand suspicions per path, each settled by its burst, and never a
    failover. 10,000 intervals of 10 ms per path: 100 s."""
    table = f"lp_loss{os.getpid()}"
    lossy = ", ".join(f'"{r.peer}"' for r in lab.rails)
    with EchoPeerProcess(lab.leaf.name, duration=300) as peer:
        daemon = echo_daemon(LOSS_INTERVAL_MS, fence=True)
        for rail in lab.rails:
            wait_for_sync(lambda r=rail: assessment(daemon.status(), r.port, "echo").get("status") == "ok",
                          5.0, "echo up")
        try:
            lab.leaf.nft(f"""
table inet {table} {{
  chain in {{ type filter hook input priority 0; iifname {{ {lossy} }} numgen random mod 100 < 5 drop; }}
  chain out {{ type filter hook output priority 0; oifname {{ {lossy} }} numgen random mod 100 < 5 drop; }}
}}""")
            time.sleep(INTERVALS * LOSS_INTERVAL_MS / 1e3)
            tables = {t: lab.host.route_nhid(t) for t in (10100, 10101)}
        finally:
            lab.leaf.nft(f"delete table inet {table}\n")
        daemon.stop()  # its last lines say what the probes saw
        log = daemon.log()
        counters = peer.stop()
    assert failovers(log) == [], failovers(log)[:5]
    assert fence_events(log) == [], fence_events(log)[:5]
    assert tables == {10100: NH0, 10101: NH1}
    # The loss reached the probes: each path's ~10,000 probes raised suspicions
    # (expected ~975 per path) and the responder answered most of them.
    assert len(suspicions(log)) == 2 and min(suspicions(log)) >= 200, suspicions(log)
    assert counters is not None and counters["requests"] >= 2 * INTERVALS * 0.85, counters


HOG_S = 60
# A busy loop that ends by itself (bounded even if this test is killed).
HOG = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end: pass"


def test_cpu_hog_on_every_core_for_a_minute_fails_nothing_over(lab, echo_daemon):
    """Busy loops on every CPU (same priority as the daemon) for 60 s, at the
    default probe interval: our stalls are measured and never read as a dead
    path."""
    hogs: list[subprocess.Popen] = []
    with EchoPeerProcess(lab.leaf.name, duration=300) as peer:
        daemon = echo_daemon(fence=True)  # the default 50 ms
        for rail in lab.rails:
            wait_for_sync(lambda r=rail: assessment(daemon.status(), r.port, "echo").get("status") == "ok",
                          5.0, "echo up")
        try:
            for _ in range(os.cpu_count() or 2):
                hogs.append(subprocess.Popen([sys.executable, "-c", HOG, str(HOG_S + 5)]))
            started = time.monotonic()
            time.sleep(HOG_S)
            assert all(h.poll() is None for h in hogs), "a hog ended early: no load was applied"
            hogged = time.monotonic() - started
            tables = {t: lab.host.route_nhid(t) for t in (10100, 10101)}
        finally:
            for h in hogs:
                h.kill()
                h.wait(5)
        daemon.stop()  # its last lines say what the probes saw
        log = daemon.log()
        counters = peer.stop()
    assert failovers(log) == [], failovers(log)[:5]
    assert fence_events(log) == [], fence_events(log)[:5]
    assert tables == {10100: NH0, 10101: NH1}
    # The hog reached the daemon: its event loop saw itself run late...
    stalls = re.search(r" event=echo_loop_lag .* stalls=(\d+)", log)
    assert stalls and int(stalls.group(1)) >= 10, stalls
    # ...and the probes kept going under load (2 paths at 50 ms for the whole minute).
    expected = 2 * hogged / 0.050
    assert counters is not None and counters["requests"] >= 0.8 * expected, (counters, expected)
