"""UDP echo probing against the real kernel: a responder in the leaf namespace,
probers in the host namespace, gray faults injected with nftables in the leaf.

The drop rules are installed first, armed but matching nothing: they match
only while the leaf port's interface group is ours. Arming is one netlink
request stamped right before it (as labs/faults does), so the measured
detection time does not include nft's start-up.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import struct

import pytest

from labs.netnslib import run, wait_for
from linkpassd.adapters.echo import EchoProber, EchoService, ProbePath
from linkpassd.adapters.echoresponder import ECHO_PORT, KIND_REPLY, KIND_REQUEST, MAGIC, PACKET, EchoResponder
from linkpassd.adapters.looplag import LoopLag
from linkpassd.core.admission import ResponderPolicy
from linkpassd.core.probe import PathState, ProbeConfig, detection_bound_s
from linkpassd.core.wire import EchoPacket

pytestmark = pytest.mark.netns

CONFIG = ProbeConfig()
TABLE = f"lp_echo{os.getpid()}"
GROUP = 0x4C50E000 + os.getpid() % 0x1000
# Real timers: epoll wakes at 1 ms granularity and a loaded 2-core VM adds its own jitter.
SLACK_S = 0.050
# The leaf stands in for a whole peer host: it answers the lab range on any address.
LAB_POLICY = ResponderPolicy.build(None, ["198.18.0.0/15"])


async def nft(ns, script: str, check: bool = True) -> None:
    """Run an nft script in a namespace without blocking the loop the probers run on."""
    proc = await asyncio.create_subprocess_exec(
        "ip", "netns", "exec", ns.name, "nft", "-f", "-", stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(script.encode()), 10)
    assert proc.returncode == 0 or not check, err.decode()


def drop_rules(direction: str) -> str:
    """Drop echo requests arriving at the leaf, or echo replies leaving it."""
    hook, match = {"requests": ("input", f"meta iifgroup {GROUP} udp dport {ECHO_PORT}"),
                   "replies": ("output", f"meta oifgroup {GROUP} udp sport {ECHO_PORT}")}[direction]
    return (f"add table inet {TABLE}\n"
            f"add chain inet {TABLE} {direction} {{ type filter hook {hook} priority 0; "
            f"policy accept; }}\n"
            f"add rule inet {TABLE} {direction} {match} counter drop\n")


async def remove_rules(ns) -> None:
    await nft(ns, f"delete table inet {TABLE}\n", check=False)


async def set_group(ipr, index: int, group: int) -> float:
    stamp = asyncio.get_running_loop().time()
    await ipr.link("set", index=index, group=group)
    return stamp


async def phase(prober: EchoProber, wanted: str, timeout: float) -> float:
    """Wait for the path's phase; return when it changed (the core's own stamp)."""
    async def reached():
        return prober.state.phase == wanted
    await wait_for(reached, timeout, f"{prober.path} {wanted} (is {prober.state.phase}: "
                                     f"{prober.assessment().detail})")
    return prober.state.since


class Probing:
    """A responder in the leaf and an echo service probing `paths` from the
    host (its probers in path order), closed in finally."""

    def __init__(self, lab, paths: list[ProbePath], respond: bool = True):
        self.lag = LoopLag(period_s=0.025)
        self.responder = (EchoResponder(netns=lab.leaf.name, policy=LAB_POLICY)
                          if respond else None)
        self.service = EchoService(paths, CONFIG, respond=False, netns=lab.host.name, lag=self.lag)
        self.probers = [self.service.probers[p] for p in paths]

    async def __aenter__(self) -> "Probing":
        self.lag.start()
        if self.responder is not None:
            self.responder.start()
        self.service.start()
        return self

    async def __aexit__(self, *exc) -> None:
        self.service.close()
        if self.responder is not None:
            self.responder.close()
        self.lag.close()


def rail_path(lab, i: int, peer_rail: int | None = None) -> ProbePath:
    rail = lab.rails[i]
    peer = lab.rails[i if peer_rail is None else peer_rail].gateway
    return ProbePath(rail.port, rail.address, peer)


@pytest.mark.parametrize("direction", ["requests", "replies"])
def test_one_way_drop_is_down_within_the_bound_and_up_after_rise(lab, direction):
    rail = lab.rails[0]

    async def scenario():
        async with lab.leaf.iproute() as ipr, Probing(lab, [rail_path(lab, 0)]) as probing:
            (index,) = await ipr.link_lookup(ifname=rail.peer)
            prober, responder = probing.probers[0], probing.responder
            try:
                await nft(lab.leaf, drop_rules(direction))
                await phase(prober, "UP", 3.0)
                await asyncio.sleep(0.5)
                before = responder.counters.requests

                fault = await set_group(ipr, index, GROUP)
                down = await phase(prober, "DOWN", 3.0) - fault
                assert down <= detection_bound_s(CONFIG) + SLACK_S, (down, prober.counters,
                                                                     probing.lag.stalls)
                a = prober.assessment()
                assert (a.signal, a.severity, a.confirmed) == (f"probe:{rail.gateway}", "DOWN", True)
                await asyncio.sleep(0.3)
                # The fault was the one we meant: requests never arrive, or are answered into nothing.
                arrived = responder.counters.requests - before
                assert (arrived > 3) == (direction == "replies"), arrived

                heal = await set_group(ipr, index, 0)
                up = await phase(prober, "UP", 3.0) - heal
                assert (CONFIG.rise - 1) * CONFIG.interval_s - 0.005 <= up \
                    <= CONFIG.rise * CONFIG.interval_s + SLACK_S, up
                n = prober.counters
                assert n.downs == 1 and n.malformed == 0
                print(f"\n{direction} dropped: DOWN after {down * 1e3:.1f} ms "
                      f"(bound {detection_bound_s(CONFIG) * 1e3:.0f} ms), UP {up * 1e3:.1f} ms "
                      f"after healing; loop lag max {probing.lag.max_lag_s * 1e3:.1f} ms; {n}")
            finally:
                await set_group(ipr, index, 0)
                await remove_rules(lab.leaf)

    run(scenario(), timeout=30)


def test_the_probe_takes_the_rail_it_is_bound_to_not_the_route(lab):
    """Both probers ask for the leaf's rail-0 address; the one bound to rail 1
    must go over rail 1, and so survive a fault on rail 0."""
    rail0 = lab.rails[0]

    async def scenario():
        paths = [rail_path(lab, 0), rail_path(lab, 1, peer_rail=0)]
        async with lab.leaf.iproute() as ipr, Probing(lab, paths) as probing:
            (index,) = await ipr.link_lookup(ifname=rail0.peer)
            on0, on1 = probing.probers
            try:
                await nft(lab.leaf, drop_rules("requests"))
                await phase(on0, "UP", 3.0)
                await phase(on1, "UP", 3.0)
                await set_group(ipr, index, GROUP)
                await phase(on0, "DOWN", 3.0)
                await asyncio.sleep(0.5)
                assert on1.state.phase == "UP" and on1.counters.downs == 0
            finally:
                await set_group(ipr, index, 0)
                await remove_rules(lab.leaf)

    run(scenario(), timeout=30)


def test_a_path_is_judged_on_its_own_silence_against_the_tolerance(lab):
    """EchoService for real: rail 0 blackholed for less than the tolerance is
    not DOWN; blackholed for good it is, while rail 1 stays UP."""
    async def scenario():
        responder = EchoResponder(netns=lab.leaf.name, policy=LAB_POLICY)
        service = EchoService([rail_path(lab, 0), rail_path(lab, 1)], CONFIG, respond=False,
                              netns=lab.host.name)
        responder.start()
        service.start()
        on0, on1 = service.probers.values()
        loop = asyncio.get_running_loop()
        async with lab.leaf.iproute() as ipr:
            (index,) = await ipr.link_lookup(ifname=lab.rails[0].peer)
            try:
                await nft(lab.leaf, drop_rules("requests"))
                await phase(on0, "UP", 3.0)
                await phase(on1, "UP", 3.0)
                short = []
                for _ in range(5):  # short blackholes, at random phases of the probes
                    await asyncio.sleep(0.05 + random.random() * CONFIG.interval_s)
                    began = await set_group(ipr, index, GROUP)
                    await asyncio.sleep(0.010)
                    await set_group(ipr, index, 0)
                    short.append(loop.time() - began)  # at most this long: both writes done
                if max(short) < CONFIG.tolerance_s:
                    assert on0.counters.downs == 0, (short, on0.assessment())
                await asyncio.sleep(0.2)
                await phase(on0, "UP", 3.0)
                downs = on0.counters.downs
                began = await set_group(ipr, index, GROUP)
                down_at = await phase(on0, "DOWN", 3.0)
                assert down_at - began <= detection_bound_s(CONFIG) + SLACK_S
                assert on0.counters.downs == downs + 1
                assert on1.state.phase == "UP" and on1.counters.downs == 0
            finally:
                await set_group(ipr, index, 0)
                await remove_rules(lab.leaf)
                service.close()
                responder.close()

    run(scenario(), timeout=30)


def raw_udp(src: str, sport: int, dst: str, dport: int, payload: bytes) -> bytes:
    """An IPv4/UDP datagram; the kernel fills in IP length, id and checksum, and
    a zero UDP checksum means none (IPv4)."""
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 0, 0, 0, 64, socket.IPPROTO_UDP, 0,
                     socket.inet_aton(src), socket.inet_aton(dst))
    return ip + struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload


def malformed_payloads(seed: int, n: int) -> list[bytes]:
    good = EchoPacket(KIND_REPLY, 1, 0, 12345).encode()
    fixed = [b"", b"x", good[:-1], good + b"\0", bytes(600),  # 600 > the receive buffer
             b"XXXX" + good[4:], good[:4] + bytes([9]) + good[5:],  # magic, version
             good[:5] + bytes([7]) + good[6:],  # kind
             EchoPacket(KIND_REQUEST, 1, 0, 12345).encode().replace(b"\x01", b"\x02", 0)[:-2]]
    rng = random.Random(seed)
    junk = [rng.randbytes(rng.choice([rng.randrange(0, 80), PACKET.size])) for _ in range(n)]
    return fixed + [j for j in junk if not j.startswith(MAGIC)]


def test_malformed_packets_are_counted_and_the_session_goes_on(lab):
    rail = lab.rails[0]

    async def scenario():
        from pyroute2.netns import create_socket

        async with Probing(lab, [rail_path(lab, 0)]) as probing:
            prober, responder = probing.probers[0], probing.responder
            await phase(prober, "UP", 3.0)
            to_responder = malformed_payloads(1, 200)
            to_prober = malformed_payloads(2, 200)
            # A well-formed request sent to the prober is malformed there too, and a
            # reply with another prober's id is a stray; a reply sent to the responder
            # is ignored (never answered: no loops between responders).
            to_prober.append(EchoPacket(KIND_REQUEST, 5, 0, prober.prober_id).encode())
            stray = EchoPacket(KIND_REPLY, 5, 0, prober.prober_id ^ 1).encode()
            ignored = EchoPacket(KIND_REPLY, 5, 0, 99).encode()
            sport = prober.sock.getsockname()[1]

            host = create_socket(lab.host.name, socket.AF_INET, socket.SOCK_DGRAM, flags=0)
            raw = create_socket(lab.leaf.name, socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW,
                                flags=0)
            try:
                for data in to_responder + [ignored]:
                    host.sendto(data, (rail.gateway, ECHO_PORT))
                for data in to_prober + [stray]:
                    # From the responder's own address and port: the only source the
                    # prober's connected socket accepts.
                    raw.sendto(raw_udp(rail.gateway, ECHO_PORT, rail.address, sport, data),
                               (rail.address, 0))
                    await asyncio.sleep(0)
            finally:
                host.close()
                raw.close()

            async def counted():
                return (responder.counters.malformed == len(to_responder)
                        and prober.counters.malformed == len(to_prober))
            await wait_for(counted, 3.0, "malformed packets counted")
            await asyncio.sleep(0.5)
            assert responder.counters.ignored == 1 and prober.counters.stray == 1
            assert prober.state.phase == "UP" and prober.counters.downs == 0
            assert prober.counters.lost == 0
            assert responder.counters.send_errors == 0

    run(scenario(), timeout=30)


def test_a_peer_without_a_responder_is_never_up_and_never_a_failure(lab):
    async def scenario():
        async with Probing(lab, [rail_path(lab, 0)], respond=False) as probing:
            prober = probing.probers[0]
            await asyncio.sleep(1.5)
            n = prober.counters
            assert prober.state.state is PathState.NEVER_UP
            assert prober.assessment().effective is None
            assert n.refused >= 1  # the peer's kernel said port unreachable
            assert n.lost == n.downs == n.silences == 0

    run(scenario(), timeout=30)


def test_two_daemons_probing_each_other_tell_which_way_a_one_way_fault_runs(lab):
    """Each side runs the service (responder and prober). Requests host->leaf are
    dropped: the host's path goes DOWN and, since the leaf's own probes still
    reach the host, says its requests are the ones lost; the leaf's path, whose
    traffic is untouched, stays UP."""
    from linkpassd.adapters.echo import EchoService

    rail = lab.rails[0]

    async def scenario():
        seen = []
        host = EchoService([ProbePath(rail.port, rail.address, rail.gateway)], CONFIG,
                           netns=lab.host.name, on_change=lambda p, a: seen.append((p, a)))
        leaf = EchoService([ProbePath(rail.peer, rail.gateway, rail.address)], CONFIG,
                           netns=lab.leaf.name)
        async with lab.leaf.iproute() as ipr:
            (index,) = await ipr.link_lookup(ifname=rail.peer)
            host.start()
            leaf.start()
            try:
                (to_leaf,), (to_host,) = host.probers.values(), leaf.probers.values()
                await nft(lab.leaf, drop_rules("requests"))
                await phase(to_leaf, "UP", 3.0)
                await phase(to_host, "UP", 3.0)
                await set_group(ipr, index, GROUP)
                await phase(to_leaf, "DOWN", 3.0)
                await asyncio.sleep(0.3)
                (a,) = host.assessments(rail.port)
                assert a.effective == "DOWN" and "our requests are being lost" in a.detail, a
                assert to_host.state.phase == "UP" and to_host.counters.downs == 0
                statuses = [x.status for _, x in seen]
                assert statuses[:2] == ["never up", "ok"] and statuses[-2:] == ["suspect", "down"]
            finally:
                host.close()
                leaf.close()
                await set_group(ipr, index, 0)
                await remove_rules(lab.leaf)

    run(scenario(), timeout=30)


def test_a_taken_echo_port_is_reported_and_retried_not_fatal(lab):
    from pyroute2.netns import create_socket

    from linkpassd.adapters.echo import EchoService

    rail = lab.rails[0]

    async def scenario():
        blocker = create_socket(lab.leaf.name, socket.AF_INET, socket.SOCK_DGRAM, flags=0)
        blocker.bind(("0.0.0.0", ECHO_PORT))
        leaf = EchoService([], CONFIG, netns=lab.leaf.name, responder_policy=LAB_POLICY)
        host = EchoService([ProbePath(rail.port, rail.address, rail.gateway)], CONFIG,
                           netns=lab.host.name, respond=False)
        try:
            leaf.start()
            host.start()
            assert "Address already in use" in leaf.responder_error
            blocker.close()
            (prober,) = host.probers.values()
            await phase(prober, "UP", 3.0)
            assert leaf.responder_error == ""
        finally:
            blocker.close()
            leaf.close()
            host.close()

    run(scenario(), timeout=30)


def test_set_paths_adds_and_removes_paths_while_the_others_keep_probing(lab):
    """A reload's change of peers: the path that stays goes on as it was (UP,
    its counters growing, no rise again), the new one comes up, the removed
    one's socket is closed."""
    async def scenario():
        responder = EchoResponder(netns=lab.leaf.name, policy=LAB_POLICY)
        first, second = rail_path(lab, 0), rail_path(lab, 1)
        service = EchoService([first], CONFIG, respond=False, netns=lab.host.name)
        responder.start()
        service.start()
        try:
            kept = service.probers[first]
            await phase(kept, "UP", 3.0)
            up_since, sent = kept.state.since, kept.counters.sent
            service.set_paths([first, second])
            added = service.probers[second]
            assert service.probers[first] is kept and kept.state.phase == "UP"
            await phase(added, "UP", 3.0)
            assert kept.state.since == up_since and kept.counters.sent > sent
            assert kept.counters.downs == 0
            service.set_paths([second])
            assert kept.sock is None and list(service.probers) == [second]
            await asyncio.sleep(0.3)
            assert added.state.phase == "UP" and added.counters.downs == 0
        finally:
            service.close()
            responder.close()

    run(scenario(), timeout=30)
