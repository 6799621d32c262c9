"""sendmmsg/recvmmsg through ctypes (adapters.mmsg) and the echo rail socket's
use of them, against the real kernel: a host namespace and a leaf namespace
joined by two veth rails (labs.netnslib.HostLab).

What must hold: every datagram of a batch reaches its own destination with
its own payload, in order; a receive batch gives each datagram's source,
length, truncation and kernel timestamp; one bad destination fails that
datagram only; an ICMP port unreachable reaches the path it was meant for
through the rail socket's error queue (IP_RECVERR), not any other path.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import pytest
from pyroute2.netns import create_socket

from labs.netnslib import run, wait_for
from linkpassd.adapters import mmsg
from linkpassd.adapters.echo import EchoService, ProbePath
from linkpassd.adapters.echoresponder import KIND_REQUEST, MAGIC, PACKET, VERSION, EchoResponder
from linkpassd.core.admission import ResponderPolicy
from linkpassd.core.probe import ProbeConfig

pytestmark = pytest.mark.netns

SO_TIMESTAMPNS = 35
STAMP = struct.Struct("@Nii qq")


def udp(ns: str, address: str, port: int = 0) -> socket.socket:
    sock = create_socket(ns, socket.AF_INET, socket.SOCK_DGRAM, flags=0)
    sock.bind((address, port))
    return sock


def recv_all(batch: mmsg.RecvBatch, fd: int, want: int, timeout: float = 3.0) -> list[tuple]:
    """(source address, source port, flags, payload, receive time) for `want` datagrams."""
    got, deadline = [], time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        n = batch.recv(fd)
        if n == 0:
            time.sleep(0.001)
            continue
        for i in range(n):
            controllen, flags, length = batch.result(i)
            port, addr4 = batch.source(i)
            rx = None
            if controllen >= STAMP.size:
                _l, level, kind, sec, nsec = STAMP.unpack_from(batch.control, i * batch.control_slot)
                if (level, kind) == (socket.SOL_SOCKET, SO_TIMESTAMPNS):
                    rx = sec + nsec * 1e-9
            data = bytes(batch.payload[i * batch.slot:i * batch.slot + min(length, batch.slot)])
            got.append((socket.inet_ntoa(addr4), port, flags, data, rx))
    return got


def test_a_send_batch_reaches_each_destination_with_its_own_payload(lab):
    host, leaf = lab.host.name, lab.leaf.name
    receivers = [udp(leaf, rail.gateway) for rail in lab.rails]
    sender = udp(host, lab.rails[0].address)
    try:
        for r in receivers:
            r.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        batch = mmsg.SendBatch(8, 16)
        sent = []
        for k in range(20):  # more than one batch: the caller sends when full
            r = receivers[k % 2]
            addr, port = r.getsockname()
            i = batch.add(socket.inet_aton(addr), port)
            payload = struct.pack("!4sI8x", b"LPMM", k)
            batch.payload[i * 16:(i + 1) * 16] = payload
            sent.append((addr, payload))
            if batch.full:
                assert batch.send(sender.fileno()) == []
        assert batch.send(sender.fileno()) == [] and len(batch) == 0
        before = time.time()
        for rail, r in zip(lab.rails, receivers):
            rb = mmsg.RecvBatch(4, 32, 64)  # smaller than what waits: several calls
            got = recv_all(rb, r.fileno(), 10)
            assert [g[3] for g in got] == [p for a, p in sent if a == rail.gateway]
            assert {(g[0], g[1], g[2]) for g in got} == {(lab.rails[0].address,
                                                          sender.getsockname()[1], 0)}
            assert all(g[4] is not None and before - 5.0 < g[4] <= time.time() for g in got)
            assert rb.recv(r.fileno()) == 0  # nothing more, and no blocking
    finally:
        for s in receivers + [sender]:
            s.close()


def test_a_long_datagram_is_flagged_truncated_and_one_bad_destination_fails_alone(lab):
    host, leaf = lab.host.name, lab.leaf.name
    receiver = udp(leaf, lab.rails[0].gateway)
    sender = udp(host, lab.rails[0].address)
    try:
        sender.sendto(bytes(100), receiver.getsockname())
        rb = mmsg.RecvBatch(4, 48, 0)
        (got,) = recv_all(rb, receiver.fileno(), 1)
        assert got[2] & socket.MSG_TRUNC and len(got[3]) == 48
        batch = mmsg.SendBatch(4, 8)
        addr, port = receiver.getsockname()
        batch.add(socket.inet_aton(addr), port)
        batch.add(socket.inet_aton("198.18.200.1"), port)  # no route from the host
        batch.add(socket.inet_aton(addr), port)
        failures = batch.send(sender.fileno())
        assert [i for i, _err in failures] == [1] and failures[0][1] != 0
        assert len(recv_all(rb, receiver.fileno(), 2)) == 2
    finally:
        receiver.close()
        sender.close()


def test_port_unreachable_reaches_the_path_it_was_for_through_the_error_queue(lab):
    """Two paths share rail 0's socket: a responder answers on one peer
    address, nobody listens on the other's echo port. The refused path, and
    only it, hears ECONNREFUSED; the other's replies keep coming."""
    rail = lab.rails[0]
    lab.leaf.ip("addr", "add", "198.19.9.1/32", "dev", "lo")
    lab.leaf.ip("addr", "add", "198.19.9.2/32", "dev", "lo")
    answered, refused = (ProbePath(rail.port, rail.address, "198.19.9.1"),
                         ProbePath(rail.port, rail.address, "198.19.9.2"))

    async def scenario():
        # Bound to 198.19.9.1 only: requests to 198.19.9.2 find no socket,
        # and the leaf's kernel answers them with ICMP port unreachable.
        responder = EchoResponder(address="198.19.9.1", netns=lab.leaf.name,
                                  policy=ResponderPolicy.build(None, ["198.18.0.0/15"]))
        responder.start()
        loop = asyncio.get_running_loop()
        cfg = ProbeConfig(interval_s=0.010)
        # The service's rail socket and probers, driven by hand (the service is not started).
        service = EchoService([answered, refused], cfg, respond=False, netns=lab.host.name)
        rs = service.sockets[(rail.port, rail.address)]
        probers = [service.probers[p] for p in (answered, refused)]
        try:
            assert rs.open(loop), rs.error
            for pr in probers:
                pr._loop = loop
            for _ in range(20):
                now = loop.time()
                for pr in probers:
                    _, sends = pr.state.poll(now)
                    for send in sends:
                        rs.queue(pr, send.seq, now)
                rs.flush()
                await asyncio.sleep(cfg.interval_s + 0.001)
                rs.drain(loop.time(), time.time(), 0.0, readable=True)
            ok, bad = probers
            assert ok.counters.received >= 15 and ok.counters.refused == 0, ok.counters
            assert bad.counters.refused >= 1 and bad.counters.received == 0, bad.counters
            assert rs.foreign == 0 and rs.sent == ok.counters.sent + bad.counters.sent == 40
        finally:
            service.close()
            responder.close()

    run(scenario(), timeout=30)


def test_replies_from_strangers_are_counted_and_dropped(lab):
    rail = lab.rails[0]

    async def scenario():
        loop = asyncio.get_running_loop()
        path = ProbePath(rail.port, rail.address, rail.gateway)
        service = EchoService([path], respond=False, netns=lab.host.name)
        rs, pr = service.sockets[(rail.port, rail.address)], service.probers[path]
        stranger = udp(lab.leaf.name, rail.gateway)  # the peer's address, not its echo port
        try:
            assert rs.open(loop), rs.error
            port = rs.sock.getsockname()[1]
            reply = PACKET.pack(MAGIC, VERSION, KIND_REQUEST, 0, 1, 0, pr.prober_id, 0, 0)
            for _ in range(5):
                stranger.sendto(reply, (rail.address, port))

            async def counted():
                rs.drain(loop.time(), time.time(), 0.0)
                return rs.foreign == 5
            await wait_for(counted, 3.0, "strangers counted")
            assert pr.counters.malformed == pr.counters.stray == pr.counters.received == 0
        finally:
            stranger.close()
            service.close()

    run(scenario(), timeout=30)
