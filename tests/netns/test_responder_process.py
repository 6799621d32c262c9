"""The echo responder as its own process (adapters.responderproc, linkpassd.responder).

Two namespaces joined by a veth pair: the prober of labs.bench.responder_hold
(its own process) in one, the responder, supervised from this test's event
loop as the daemon supervises it, in the other. The test's own Python stands
in for a busy daemon.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from labs.bench.responder_hold import PROBER_ADDR, RESPONDER_ADDR
from labs.daemonproc import assessment
from labs.echopeer import EchoPeerProcess
from labs.netnslib import run, wait_for_sync
from linkpassd.adapters.echoresponder import _BATCH, ECHO_PORT
from linkpassd.adapters.responderproc import ResponderProcess
from linkpassd.core.admission import ResponderPolicy

pytestmark = pytest.mark.netns

POLICY = ResponderPolicy.build([RESPONDER_ADDR], ["198.18.0.0/15"], rate_pps=1e6, burst=100_000)


@pytest.fixture
def pair(netns_factory):
    a, b = netns_factory("pa"), netns_factory("pb")
    a.ip("link", "add", "lprp0", "type", "veth", "peer", "name", "lprp1", "netns", b.name)
    for ns, dev, addr in ((a, "lprp0", PROBER_ADDR), (b, "lprp1", RESPONDER_ADDR)):
        ns.ip("addr", "add", f"{addr}/24", "dev", dev)
        ns.ip("link", "set", dev, "up")
    return a, b


def start_prober(ns, pps: float, seconds: float) -> subprocess.Popen:
    return subprocess.Popen(
        ["ip", "netns", "exec", ns.name, sys.executable, "-m", "labs.bench.responder_hold",
         "--role", "prober", "--pps", str(pps), "--seconds", str(seconds)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


async def finished(prober: subprocess.Popen, timeout: float) -> dict:
    out, err = await asyncio.to_thread(prober.communicate, timeout=timeout)
    assert prober.returncode == 0, err
    return json.loads(out)


async def until(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def test_replies_stay_prompt_while_the_daemons_python_is_blocked(pair):
    """The daemon's event loop blocked, its interpreter lock held in C calls
    of 200 ms and more, for 1.5 s: every request is answered within a few ms
    (a responder thread in the daemon answered none until the lock came back)."""
    a, b = pair
    big = [random.random() for _ in range(1_500_000)]

    async def scenario():
        r = ResponderProcess(ECHO_PORT, policy=POLICY, netns=b.name)
        r.start()
        try:
            await until(lambda: r.sched, 10.0, "the responder process to run")
            prober = start_prober(a, 500, 2.5)
            await asyncio.sleep(0.5)
            slices, began = [], time.monotonic()
            while time.monotonic() - began < 1.5:  # the loop blocked, the lock held
                t0 = time.perf_counter()
                sorted(big)
                slices.append(time.perf_counter() - t0)
            result = await finished(prober, 30)
            return r.sched, slices, result, r.counters()
        finally:
            r.close()

    sched, slices, result, counters = run(scenario(), timeout=60)
    rtt = sorted(result["rtt_us"])
    p99, worst = rtt[int(0.99 * len(rtt))], rtt[-1]
    held = max(result["held_us"])  # kernel receive to reply, in the responder
    print(f"\nresponder {sched}; lock held in slices of {min(slices) * 1e3:.0f}-"
          f"{max(slices) * 1e3:.0f} ms; {len(rtt)} replies, round trip p50 "
          f"{rtt[len(rtt) // 2]:.0f} µs, p99 {p99:.0f} µs, max {worst:.0f} µs; held_us max "
          f"{held}; {counters}")
    assert min(slices) >= 0.2, "the test must hold the lock for 200 ms at a time"
    assert result["lost"] == 0, result["lost"]
    # A responder that waited on the daemon would hold requests 200 ms and more.
    # The subject is the responder's own hold; the round trip also holds the
    # test's prober (another Python process on these 2 cores), so its bounds
    # only say every reply came well inside a peer's 30 ms tolerance.
    assert held < 5_000, f"the responder held a request {held} µs while the daemon was blocked"
    assert p99 < 5_000, f"round trip p99 {p99:.0f} µs while the daemon was blocked"
    assert worst < 20_000, f"a round trip of {worst:.0f} µs while the daemon was blocked"
    assert counters.answered >= 0.9 * result["sent"]


def test_the_responder_is_restarted_after_sigkill_and_loses_no_request(pair):
    """SIGKILL the responder mid-stream: the daemon sees it through a pidfd,
    starts another at once, and, since the daemon holds the socket, the
    requests that arrived meanwhile wait in its queue and are answered (only
    the batch the killed one had read may be lost)."""
    a, b = pair

    async def scenario():
        r = ResponderProcess(ECHO_PORT, policy=POLICY, netns=b.name)
        r.start()
        try:
            await until(lambda: r.sched, 10.0, "the responder process to run")
            first = r.pid
            prober = start_prober(a, 500, 3.0)
            await asyncio.sleep(1.0)
            os.kill(first, signal.SIGKILL)
            killed = time.monotonic()
            await until(lambda: r.pid not in (None, first) and r.restarts == 1, 5.0,
                        "a new responder")
            await until(lambda: r._child.answered > 0, 5.0, "the new one to answer")
            back = time.monotonic() - killed
            result = await finished(prober, 30)
            await asyncio.sleep(0.3)  # its last counters
            return first, r.pid, back, result, r.counters(), r.error
        finally:
            r.close()

    first, second, back, result, counters, error = run(scenario(), timeout=60)
    rtt = sorted(result["rtt_us"])
    print(f"\nkilled {first}, answering again as {second} after {back * 1e3:.0f} ms; "
          f"max round trip {rtt[-1] / 1e3:.0f} ms; {counters}")
    assert first != second
    # Requests that arrived while no responder ran waited in the socket and were
    # answered; lost are at most those the killed one had read and not answered.
    assert result["lost"] <= _BATCH, result["lost"]
    # The new responder judged what waited by the daemon's policy, not by an empty one.
    assert counters.refused_address == 0, counters
    assert back < 1.0
    assert error == ""
    # Counters add up over both processes (the killed one's last 100 ms may be unreported).
    assert counters.answered >= 0.9 * result["sent"], counters


def test_the_responder_process_exits_when_its_daemon_is_gone(pair):
    """End of file on its pipe: it exits, so a restarted daemon can bind the port again."""
    _a, b = pair
    parent = subprocess.Popen(
        ["ip", "netns", "exec", b.name, sys.executable, "-c",
         "import asyncio, sys\n"
         "from linkpassd.adapters.responderproc import ResponderProcess\n"
         "async def main():\n"
         "    r = ResponderProcess(4793)\n"
         "    r.start()\n"
         "    while not r.pid or not r.sched:\n"
         "        await asyncio.sleep(0.01)\n"
         "    print('PID', r.pid, flush=True)\n"
         "    await asyncio.sleep(30)\n"
         "asyncio.run(main())\n"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        while not line.startswith("PID "):  # (the responder's log lines come first)
            line = parent.stdout.readline()
            assert line, parent.stderr.read()
        child = int(line.split()[1])
        parent.kill()
        parent.wait(5)
        wait_for_sync(lambda: not os.path.exists(f"/proc/{child}") or
                      open(f"/proc/{child}/stat").read().split()[2] == "Z", 3.0,
                      "the orphaned responder to exit")
        subprocess.run(["ip", "netns", "exec", b.name, sys.executable, "-c",
                        "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
                        ".bind(('0.0.0.0', 4793))"], check=True, timeout=10)  # free again
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(5)


def test_a_port_taken_by_another_process_is_a_problem_in_status_and_probing_goes_on(
        lab, echo_daemon):
    """Another process holds UDP 4793 on the host: the daemon says so in its
    status (a problem of kind "responder") and its log, and still probes its
    peers and protects its own traffic."""
    squatter = subprocess.Popen(
        ["ip", "netns", "exec", lab.host.name, sys.executable, "-c",
         "import socket, time\n"
         "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
         f"s.bind(('0.0.0.0', {ECHO_PORT}))\n"
         "print('bound', flush=True)\n"
         "time.sleep(60)\n"], stdout=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout.readline().strip() == "bound"
        with EchoPeerProcess(lab.leaf.name, duration=60):
            daemon = echo_daemon()
            rail0 = lab.rails[0]
            wait_for_sync(lambda: assessment(daemon.status(), rail0.port, "echo").get("status")
                          == "ok", 5.0, "echo up on rail0 (our own probes)")
            problems = [p for p in daemon.status().get("problems", [])
                        if p.get("kind") == "responder"]
            assert len(problems) == 1, daemon.status().get("problems")
            assert "cannot bind" in problems[0]["detail"] and "in use" in problems[0]["detail"]
            assert "echo_responder_failed" in daemon.log()
            assert daemon.status()["last_error"] == ""
    finally:
        squatter.kill()
        squatter.wait(5)


def test_a_reload_that_changes_echo_timers_leaves_the_responder_running(lab, echo_daemon,
                                                                        tmp_path):
    """Issue 30: a reload that changed echo timers joined the responder thread
    (up to 0.2 s) and rebound its port. Now the echo service is rebuilt and
    the responder process is left alone: the same process answers on."""
    daemon = echo_daemon(interval_ms=50)
    wait_for_sync(lambda: "echo_responder_running" in daemon.log(), 10.0, "the responder")
    cfg = tmp_path / "linkpassd.toml"
    text = cfg.read_text()
    assert "interval_ms = 50" in text
    cfg.write_text(text.replace("interval_ms = 50", "interval_ms = 20"))
    daemon.proc.send_signal(signal.SIGHUP)
    wait_for_sync(lambda: daemon.log().count("echo_probing") >= 2, 10.0, "the reload")
    time.sleep(0.5)
    log = daemon.log()
    assert log.count("echo_responder_running") == 1, log
    assert "echo_responder_stopped" not in log and "echo_responder_died" not in log
    assert not [p for p in daemon.status().get("problems", []) if p.get("kind") == "responder"]
