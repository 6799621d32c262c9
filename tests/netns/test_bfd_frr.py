"""Our BFD against FRR's bfdd, over a veth between two namespaces.

leaf namespace: FRR (zebra + bfdd) with a single-hop peer toward the host,
100 ms x 3 through a profile. host namespace: our BfdAgent, as an asyncio task
in this process whose sockets were opened inside the namespace.

Shows: the session comes Up with FRR (and FRR says so); a blackhole (nftables
drop in the leaf, table lp_bfd_*) takes it Down within the detection time with
diag "Control Detection Time Expired"; it comes back Up once the drop goes; a
wrong TTL or garbage is counted and dropped without disturbing the session;
when *our* loop stalls past FRR's detection time, the Down FRR then signals
arrives carrying the stall (lag), and we never claim a detection of our own;
a Down asked about again (BfdAgent.recheck) is reported again one window on
only if it held and the peer stayed silent;
tshark dissects everything we sent as valid BFD version 1 with TTL 255.
Set LP_BFD_PCAP=/some/file.pcap to keep the capture.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import socket
import subprocess
import time

import pytest

from labs.frr import BfdPeer, FrrBfd
from labs.netnslib import HostLab, run
from linkpassd.adapters.bfd import BfdAgent, PeerSpec, in_netns
from linkpassd.core.bfd import ControlPacket, Diag, SessionConfig, State, diag_name, encode

pytestmark = pytest.mark.netns

INTERVAL_MS = 100
MULT = 3
DETECT_S = MULT * INTERVAL_MS / 1000
SLACK_S = 0.5  # generous: a 2-core VM running FRR, tcpdump and this test
_serial = itertools.count()


def nft(netns: str, script: str) -> None:
    subprocess.run(["ip", "netns", "exec", netns, "nft", "-f", "-"], input=script, text=True,
                   check=True, capture_output=True, timeout=10)


class Capture:
    """tcpdump on one interface of a namespace, stopped by PID."""

    def __init__(self, netns: str, ifname: str, path):
        self.path = path
        self.proc = subprocess.Popen(
            # --immediate-mode: hand each packet over at once, or the last
            # ones can still sit in the capture ring when we stop it.
            ["ip", "netns", "exec", netns, "tcpdump", "-i", ifname, "-n", "-U", "-Z", "root",
             "--immediate-mode",
             "-w", str(path), "udp", "port", "3784"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 10
        line = ""
        while "listening" not in line:  # tcpdump says so once the filter is attached
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise AssertionError(f"tcpdump did not start: {line}")
            line = self.proc.stderr.readline()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stderr:
            self.proc.stderr.close()


def blackhole(netns: str, table: str) -> None:
    """Drop BFD both ways in the leaf (nft table `table`; deleting it heals)."""
    nft(netns, f"table inet {table} {{\n"
        "  chain input { type filter hook input priority -10; policy accept;\n"
        "    udp dport 3784 counter drop; }\n"
        "  chain output { type filter hook output priority -10; policy accept;\n"
        "    udp dport 3784 counter drop; }\n"
        "}\n")


def tshark_fields(path, display_filter: str, *fields: str) -> list[list[str]]:
    args = ["tshark", "-r", str(path), "-Y", display_filter, "-T", "fields",
            "-E", "separator=|", "-E", "occurrence=a"]
    for f in fields:
        args += ["-e", f]
    out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=60).stdout
    return [line.split("|") for line in out.splitlines() if line]


def test_our_bfd_session_with_frr_bfdd(netns_factory, tmp_path):
    lab = HostLab.build(netns_factory, n_rails=1)
    rail = lab.rails[0]  # host lprail0 198.18.0.2  <->  leaf lpleaf0 198.18.0.1
    frr = FrrBfd(lab.leaf.name, [BfdPeer(peer=rail.address, local=rail.gateway,
                                         ifname=rail.peer, transmit_ms=INTERVAL_MS,
                                         receive_ms=INTERVAL_MS, detect_mult=MULT)])
    pcap = tmp_path / "bfd.pcap"
    keep = os.environ.get("LP_BFD_PCAP")  # keep the capture for a look with tshark/wireshark
    table = f"lp_bfd_blackhole{os.getpid()}_{next(_serial)}"
    capture = None
    report: dict = {}
    try:
        t_frr = time.monotonic()
        frr.start()
        report["frr_start_s"] = round(time.monotonic() - t_frr, 2)
        capture = Capture(lab.host.name, rail.port, pcap)
        run(scenario(lab, rail, frr, table, report), timeout=90)
    except BaseException:
        print(frr.logs())
        raise
    finally:
        if capture is not None:
            capture.stop()
        try:
            frr.stop()
        finally:
            frr.cleanup()
    print("BFD vs FRR:", report)
    if keep:
        subprocess.run(["cp", str(pcap), keep], check=True)

    # tshark: every packet we sent is a valid BFD v1 control packet with TTL 255.
    ours = tshark_fields(pcap, f"ip.src == {rail.address} && udp.dstport == 3784",
                         "ip.ttl", "udp.srcport", "bfd.version", "bfd.sta", "bfd.diag",
                         "bfd.message_length", "bfd.flags.p", "bfd.flags.f", "bfd.flags.a",
                         "bfd.flags.m")
    assert len(ours) > 20
    assert {row[0] for row in ours} == {"255"}
    assert len({row[1] for row in ours}) == 1 and 49152 <= int(ours[0][1]) <= 65535
    assert {row[2] for row in ours} == {"1"}
    assert {"0x00", "0x01", "0x02", "0x03"} >= {row[3] for row in ours} >= {"0x01", "0x03"}
    assert {"0x00", "0x01", "0x03"} >= {row[4] for row in ours[:-1]}
    assert ours[-1][3:5] == ["0x00", "0x07"]  # closing: AdminDown, "Administratively Down"
    assert {row[5] for row in ours} == {"24"}
    assert any(row[6] == "1" for row in ours)  # our Poll (slow start -> 100 ms) ...
    assert any(row[7] == "1" for row in ours)  # ... and our Final to FRR's Poll
    assert not any(row[6] == row[7] == "1" for row in ours)
    assert {row[8] for row in ours} == {row[9] for row in ours} == {"0"}

    def flagged(src: str) -> list[list[str]]:
        return tshark_fields(pcap, f"ip.src == {src} && (_ws.malformed || _ws.expert)",
                             "frame.number", "_ws.expert.message")

    assert flagged(rail.address) == []
    assert flagged(rail.gateway)  # the check can fire: our 2-byte garbage from the leaf is
    theirs = tshark_fields(pcap, f"ip.src == {rail.gateway} && bfd.version == 1", "ip.ttl")
    assert sorted(row[0] for row in theirs).count("64") == 1  # our spoof; FRR's are all 255
    assert {row[0] for row in theirs} == {"255", "64"}


async def scenario(lab, rail, frr: FrrBfd, table: str, report: dict) -> None:
    loop = asyncio.get_running_loop()
    events = []
    changed = asyncio.Event()

    def emit(event):
        events.append(event)
        changed.set()

    async def next_event(new: State, timeout: float, after: int):
        deadline = loop.time() + timeout
        while True:
            for e in events[after:]:
                if e.new is new:
                    return e
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(f"no {new} within {timeout}s; events: "
                                     f"{[(str(e.old), str(e.new), e.diag) for e in events]}")
            changed.clear()
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except asyncio.TimeoutError:
                pass

    async def frr_status(want: str, timeout: float) -> dict:
        deadline = loop.time() + timeout
        while True:
            peer = await asyncio.to_thread(frr.bfd_peer, rail.address)
            if peer and peer.get("status") == want:
                return peer
            if loop.time() > deadline:
                raise AssertionError(f"FRR peer not {want} after {timeout}s: {peer}")
            await asyncio.sleep(0.1)

    agent = BfdAgent(emit=emit, netns=lab.host.name)
    cfg = SessionConfig(desired_min_tx_us=INTERVAL_MS * 1000,
                        required_min_rx_us=INTERVAL_MS * 1000, detect_mult=MULT)
    async with agent:
        failures = asyncio.create_task(agent.run())
        t0 = loop.time()
        name = agent.add(PeerSpec(rail.port, rail.address, rail.gateway, cfg, name="rail0"))

        # 1. Up with FRR; FRR agrees and runs at 100 ms after its poll.
        up = await next_event(State.UP, 15.0, 0)
        report["up_after_s"] = round(up.change.at - t0, 3)
        peer = await frr_status("up", 5.0)
        session = agent.session(name)
        assert peer["remote-id"] == session.local_discr and peer["id"] == session.remote_discr
        await asyncio.sleep(2.0)  # both sides settle on 100 ms
        peer = await asyncio.to_thread(frr.bfd_peer, rail.address)
        assert peer["status"] == "up"
        assert peer["remote-transmit-interval"] == INTERVAL_MS
        assert peer["remote-receive-interval"] == INTERVAL_MS
        session = agent.session(name)
        assert session.state is State.UP and session.transmit_interval_us == INTERVAL_MS * 1000
        assert session.detection_time_us == MULT * INTERVAL_MS * 1000
        assert [str(e.new) for e in events] == ["Init", "Up"] or \
            [str(e.new) for e in events] == ["Up"]

        # 2. Wrong TTL and garbage from the leaf: counted, dropped, no effect.
        def leaf_socket(ttl: int) -> socket.socket:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, ttl)
            return s

        spoof = encode(ControlPacket(my_discr=peer["id"], your_discr=session.local_discr,
                                     state=State.DOWN))
        for ttl, data in ((64, spoof), (255, b"\x20\xc0"), (255, b"\x40" + bytes(23))):
            s = in_netns(lab.leaf.name, lambda ttl=ttl: leaf_socket(ttl))
            try:
                s.sendto(data, (rail.address, 3784))
            finally:
                s.close()
        await asyncio.sleep(0.3)
        assert agent.drops["ttl"] == 1 and agent.drops["truncated"] == 1
        assert agent.drops["version"] == 1
        assert agent.session(name).state is State.UP and len(events) <= 2

        # 3. Blackhole both directions in the leaf: Down with diag 1 within the detection time.
        n = len(events)
        await asyncio.to_thread(blackhole, lab.leaf.name, table)
        t_cut = loop.time()
        down = await next_event(State.DOWN, DETECT_S + 5.0, n)
        report["down_after_cut_s"] = round(down.change.at - t_cut, 3)
        report["since_last_rx_s"] = round(down.since_last_rx_s, 3)
        report["detect_lag_ms"] = round(down.lag_s * 1000, 3)
        report["detect_max_lag_ms"] = round(down.max_lag_s * 1000, 3)
        assert down.diag == Diag.CONTROL_DETECTION_TIME_EXPIRED and down.old is State.UP
        assert down.ever_up
        assert down.detection_time_s == pytest.approx(DETECT_S)
        assert down.change.at - t_cut <= DETECT_S + SLACK_S
        assert DETECT_S - 0.005 <= down.since_last_rx_s <= DETECT_S + SLACK_S
        assert down.max_lag_s < DETECT_S  # a genuine silence, not our own stall
        await frr_status("down", 5.0)

        # 4. Heal: Up again (FRR and we are both in the 1 s slow start now).
        n = len(events)
        await asyncio.to_thread(nft, lab.leaf.name, f"delete table inet {table}\n")
        t_heal = loop.time()
        again = await next_event(State.UP, 10.0, n)
        report["up_after_heal_s"] = round(again.change.at - t_heal, 3)
        peer = await frr_status("up", 5.0)
        assert agent.session(name).up_count == 2 and agent.session(name).down_count == 1
        await asyncio.sleep(1.0)
        assert agent.session(name).state is State.UP

        # 5. Our own stall: the loop blocks for 1 s, over FRR's 300 ms detection time.
        # FRR rightly times us out; we must not read that as our path dying
        # (no diag-1 detection of ours), and the Down FRR signals carries the stall.
        n = len(events)
        time.sleep(1.0)  # deliberately blocks the event loop
        down = await next_event(State.DOWN, 3.0, n)
        report["stall_down"] = (diag_name(down.diag), round(down.lag_s, 3),
                                round(down.max_lag_s, 3))
        assert down.diag == Diag.NEIGHBOR_SIGNALED_SESSION_DOWN
        assert down.max_lag_s >= 0.9
        assert not [e for e in events[n:] if e.diag == Diag.CONTROL_DETECTION_TIME_EXPIRED
                    and e.new is State.DOWN]
        # ...and asked again (as the daemon does for a Down its stall explains),
        # the healthy peer is heard within the window: Up, and no recheck report.
        agent.recheck(name, DETECT_S)
        await next_event(State.UP, 10.0, n)
        await asyncio.sleep(DETECT_S + 1.0 + SLACK_S)
        assert not [e for e in events[n:] if e.recheck]

        # 6. A Down that holds: blackhole again, ask again; one window on, the
        # session is still Down and silent, reported with the lag of that window.
        n = len(events)
        await asyncio.to_thread(blackhole, lab.leaf.name, table)
        down = await next_event(State.DOWN, DETECT_S + 5.0, n)
        agent.recheck(name, DETECT_S)
        asked = loop.time()
        again = await next_event(State.DOWN, DETECT_S + 1.0 + 5.0, len(events))
        report["recheck_after_s"] = round(again.change.at - asked, 3)
        assert again.recheck and again.old is State.DOWN and again.ever_up
        assert again.diag == Diag.CONTROL_DETECTION_TIME_EXPIRED
        assert again.detection_time_s == pytest.approx(DETECT_S)
        assert DETECT_S + 1.0 - 0.01 <= again.change.at - asked <= DETECT_S + 1.0 + SLACK_S
        assert again.max_lag_s < DETECT_S / 2
        await asyncio.to_thread(nft, lab.leaf.name, f"delete table inet {table}\n")
        await next_event(State.UP, 10.0, n)

        report["lag_ms"] = {k.removesuffix("_s"): round(v * 1000, 3) if k != "count" else v
                         for k, v in agent.lag.snapshot().items()}
        report["drops"] = dict(agent.drops)
        report["counters"] = dict(agent.counters)
        report["events"] = [(str(e.old), str(e.new), e.diag, round(e.change.at - t0, 3))
                            for e in events]
        assert not failures.done()
        failures.cancel()
