"""The echo adapter's wire format, responder and receive paths with fake
sockets: no root. The judgement (core.probe) is in test_probe_contract.py."""

from __future__ import annotations

import math
import socket
import struct
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from linkpassd.adapters import echo, echoresponder
from linkpassd.core import wire
from linkpassd.core.admission import ResponderPolicy
from linkpassd.core.probe import PathState, ProbeConfig

PEER = "198.18.1.2"
INF = math.inf
BFD_DETECT_MULT = 3  # FRR bfdd's default detect-multiplier


# --------------------------------------------------------------------------
# The wire format and the adapter's receive paths (no sockets: fakes)
# --------------------------------------------------------------------------

u32, u64 = st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1)


@given(st.sampled_from([echoresponder.KIND_REQUEST, echoresponder.KIND_REPLY]), u32, u64, u64, u64, u32)
def test_packets_round_trip(kind, seq, sent_ns, prober_id, responder_id, held_us):
    pkt = wire.EchoPacket(kind, seq, sent_ns, prober_id, responder_id, held_us)
    data = pkt.encode()
    assert len(data) == echoresponder.PACKET.size == 40
    assert wire.parse(data) == (pkt, "")
    assert wire.parse(data, truncated=True)[0] is None


@given(st.binary(max_size=120))
def test_parse_never_raises_and_accepts_only_the_format(data):
    pkt, why = wire.parse(data)
    valid = (len(data) == 40 and data[:4] == echoresponder.MAGIC and data[4] == echoresponder.VERSION
             and data[5] in (echoresponder.KIND_REQUEST, echoresponder.KIND_REPLY))
    assert (pkt is not None) == valid and (why == "") == valid


def test_parse_says_why():
    good = wire.EchoPacket(echoresponder.KIND_REQUEST, 1, 2, 3).encode()
    assert wire.parse(good[:-1])[1] == "too short"
    assert wire.parse(good + b"\0")[1] == "too long"
    assert wire.parse(b"LPEX" + good[4:])[1] == "bad magic"
    assert wire.parse(good[:4] + b"\x02" + good[5:])[1] == "version 2"
    assert wire.parse(good[:5] + b"\x03" + good[6:])[1] == "kind 3"


class FakeSocket:
    def __init__(self):
        self.sent = []

    def sendto(self, data, addr):
        self.sent.append((data, None, addr))

    def sendmsg(self, buffers, ancdata, flags, addr):
        self.sent.append((b"".join(buffers), ancdata, addr))


def timestamp_cmsg(unix_s: float):
    sec = int(unix_s)
    return (socket.SOL_SOCKET, echoresponder.SCM_TIMESTAMPNS,
            struct.pack("@qq", sec, int((unix_s - sec) * 1e9)))


def pktinfo_cmsg(ifindex: int, local: str):
    return (socket.IPPROTO_IP, echoresponder.IP_PKTINFO,
            struct.pack("@i4s4s", ifindex, socket.inet_aton(local), socket.inet_aton(local)))


RAIL_POLICY = ResponderPolicy.build({"198.18.0.1"}, ["198.18.0.0/24"], peers={"198.19.5.5"})


def responder(policy=RAIL_POLICY, **kw):
    heard = []
    r = echoresponder.EchoResponder(policy=policy, on_heard=heard.append, **kw)
    r.sock = FakeSocket()
    return r, heard


def request(seq=7) -> bytes:
    return wire.EchoPacket(echoresponder.KIND_REQUEST, seq, 123456789, 42).encode()


def test_the_responder_answers_from_the_address_and_interface_the_request_came_to():
    r, heard = responder()
    anc = [timestamp_cmsg(time.time() - 0.003), pktinfo_cmsg(5, "198.18.0.1")]
    r._answer(request(), anc, 0, ("198.18.0.2", 40000))
    (data, ancdata, addr), = r.sock.sent
    reply, _ = wire.parse(data)
    assert (reply.kind, reply.seq, reply.sent_ns, reply.prober_id) == (echoresponder.KIND_REPLY, 7, 123456789, 42)
    assert reply.responder_id == r.responder_id and 2_500 <= reply.held_us <= 1_000_000
    assert len(data) == len(request())  # never larger than the request
    assert addr == ("198.18.0.2", 40000)
    ((level, kind, info),) = ancdata
    assert (level, kind) == (socket.IPPROTO_IP, echoresponder.IP_PKTINFO)
    assert struct.unpack("@i4s4s", info)[:2] == (5, socket.inet_aton("198.18.0.1"))
    assert [list(h) for h in heard] == [[("198.18.0.1", "198.18.0.2")]]
    # A reply sent to a responder is never answered: two responders cannot ping-pong.
    r._answer(wire.EchoPacket(echoresponder.KIND_REPLY, 7, 1, 42).encode(), anc, 0, ("198.18.0.2", 4793))
    assert len(r.sock.sent) == 1 and r.counters.ignored == 1


def test_the_responder_answers_only_on_rail_addresses_and_only_allowed_sources():
    r, heard = responder()
    on_rail = [pktinfo_cmsg(5, "198.18.0.1")]
    r._answer(request(), [pktinfo_cmsg(1, "127.0.0.1")], 0, ("198.18.0.2", 1))  # loopback
    r._answer(request(), [pktinfo_cmsg(2, "10.0.0.5")], 0, ("198.18.0.2", 1))  # management
    r._answer(request(), [], 0, ("198.18.0.2", 1))  # no destination known: not answered
    r._answer(request(), on_rail, 0, ("198.19.0.2", 1))  # outside the fabric prefixes
    r._answer(b"garbage from outside", on_rail, 0, ("203.0.113.9", 1))  # refused before parsing
    assert r.sock.sent == [] and heard == []
    c = r.counters
    assert (c.refused_address, c.refused_source, c.malformed, c.answered) == (3, 2, 0, 0)
    r._answer(request(), on_rail, 0, ("198.19.5.5", 1))  # a configured peer, outside the prefixes
    r._answer(request(), on_rail, 0, ("198.18.0.77", 1))  # inside the prefixes
    assert c.answered == 2 and len(r.sock.sent) == 2


def test_the_responder_rate_limits_each_source_and_counts_it():
    policy = ResponderPolicy.build({"198.18.0.1"}, ["198.18.0.0/24"], rate_pps=1.0, burst=3)
    r, _ = responder(policy)
    on_rail = [pktinfo_cmsg(5, "198.18.0.1")]
    for _ in range(10):
        r._answer(request(), on_rail, 0, ("198.18.0.2", 1))
    r._answer(request(), on_rail, 0, ("198.18.0.3", 1))  # another source has its own bucket
    c = r.counters
    # The first request of a prober id: the unknown-id buckets; then its own
    # bucket of 3 (core.admission).
    assert (c.answered, c.rate_limited, c.requests) == (5, 6, 11)
    assert len(r.sock.sent) == 5  # one reply per answered request, never more


def test_the_responder_hands_what_it_heard_to_the_loop_in_batches():
    """A flood of allowed requests is not one loop callback per packet."""
    r, heard = responder(ResponderPolicy.build({"198.18.0.1"}, ["198.18.0.0/24"]))
    on_rail = [pktinfo_cmsg(5, "198.18.0.1")]
    began = time.monotonic()
    for i in range(2000):
        r._answer(request(i), on_rail, 0, (f"198.18.0.{2 + i % 3}", 1))
    took = time.monotonic() - began
    assert r.counters.answered == 2000
    assert len(heard) <= 1 + took / echoresponder._HANDOFF_S, (len(heard), took)
    assert len(heard) < 2000 / 10
    r._hand_off(time.monotonic(), force=True)
    pairs = {pair for batch in heard for pair in batch}
    assert pairs == {("198.18.0.1", f"198.18.0.{n}") for n in (2, 3, 4)}


def test_a_new_policy_takes_effect_at_once():
    r, _ = responder()
    on_rail = [pktinfo_cmsg(5, "198.18.0.9")]
    r._answer(request(), on_rail, 0, ("198.18.0.2", 1))
    assert r.counters.refused_address == 1
    r.set_policy(ResponderPolicy.build({"198.18.0.1", "198.18.0.9"}, ["198.18.0.0/24"]))
    r._answer(request(), on_rail, 0, ("198.18.0.2", 1))
    assert r.counters.answered == 1


@settings(max_examples=300)
@given(data=st.binary(max_size=100), truncated=st.booleans(),
       anc=st.lists(st.tuples(st.sampled_from([socket.SOL_SOCKET, socket.IPPROTO_IP, 99]),
                              st.sampled_from([echoresponder.SCM_TIMESTAMPNS, echoresponder.IP_PKTINFO, 1]),
                              st.binary(max_size=24)), max_size=3),
       src=st.sampled_from(["198.18.0.2", "198.19.0.2"]))
def test_garbage_at_the_responder_is_counted_never_raised(data, truncated, anc, src):
    r, _ = responder(ResponderPolicy.build(None, ["198.18.0.0/24"]))
    r._answer(data, anc, socket.MSG_TRUNC if truncated else 0, (src, 1))
    c = r.counters
    assert c.malformed + c.ignored + c.requests + c.refused_source + c.refused_address == 1
    assert len(r.sock.sent) == c.answered <= c.requests


def service_prober(path: echo.ProbePath) -> echo.EchoProber:
    """The prober of `path` in an echo service that is not started (no socket)."""
    return echo.EchoService([path], respond=False).probers[path]


@settings(max_examples=300)
@given(data=st.binary(max_size=100), truncated=st.booleans())
def test_garbage_at_the_prober_is_counted_never_raised(data, truncated):
    pr = service_prober(echo.ProbePath("lprail0", "198.18.0.2", "198.18.0.1"))
    pr._received(data, [], socket.MSG_TRUNC if truncated else 0, 1.0, time.time(), 0.0)
    c = pr.counters
    assert c.malformed + c.stray == 1 and c.received == 0
    assert pr.state.state is PathState.NEVER_UP


def test_the_prober_matches_its_replies_and_uses_the_kernel_receive_time():
    pr = service_prober(echo.ProbePath("lprail0", "198.18.0.2", "198.18.0.1"))
    pr.state, (send,) = pr.state.poll(10.0)
    reply = wire.EchoPacket(echoresponder.KIND_REPLY, send.seq, round(10.0 * 1e9), pr.prober_id, 7,
                            0).encode()
    wall = time.time()
    # Read 30 ms after it arrived (a busy loop), but the kernel says it came at +0.5 ms.
    pr._received(reply, [timestamp_cmsg(wall - 0.0295)], 0, 10.030, wall, 0.0)
    assert pr.counters.received == 1 and pr.counters.late == 0
    assert pr.state.rtt_s == pytest.approx(0.0005, abs=2e-4)
    other = wire.EchoPacket(echoresponder.KIND_REPLY, send.seq, round(10.0 * 1e9),
                            pr.prober_id ^ 1).encode()
    pr._received(other, [], 0, 10.031, wall, 0.0)
    assert pr.counters.stray == 1


def test_echo_paths_are_ipv4_for_now():
    with pytest.raises(ValueError):
        echo.ProbePath("lprail0", "fd00::2", "fd00::1")


def test_set_paths_keeps_what_the_staying_paths_know_and_only_adds_and_removes():
    a = echo.ProbePath("lprail0", "198.18.0.2", "198.19.0.1")
    b = echo.ProbePath("lprail0", "198.18.0.2", "198.19.0.2")
    c = echo.ProbePath("lprail1", "198.18.1.2", "198.19.0.1")
    changes = []
    service = echo.EchoService([a, b], ProbeConfig(), respond=False,
                               on_change=lambda path, assessment: changes.append(path))
    kept = service.probers[a]
    # Prober a has history: up after `rise` replies, some of its loss window filled.
    state = kept.state
    for i in range(5):
        t = 10.0 + i * 0.051  # a little after each steady probe is due
        state, (send,) = state.poll(t)
        state = state.on_reply(send.seq, t + 0.0005, t + 0.0005)
    kept.state = state
    assert state.state is PathState.UP and len(state.window) == 2

    service.set_paths([a, c])
    assert set(service.probers) == {a, c} and service.paths == (a, c)
    assert service.probers[a] is kept and kept.state is state  # nothing reset
    assert service.probers[c].state.state is PathState.NEVER_UP
    assert service.probers[c].prober_id == kept.prober_id  # one id for the service's probers
    assert changes == [b]  # the owner hears of the removed path, so it re-reads the port
    assert service._by_addresses == {(a.source, a.peer): kept,
                                     (c.source, c.peer): service.probers[c]}
    assert [x.signal for x in service.assessments("lprail0")] == ["probe:198.19.0.1"]


# ---- the responder's batched path (adapters.mmsg buffers, filled by hand) ----

def _fill(batch, i: int, data: bytes, src: tuple[str, int], pktinfo=None, rx=None, flags=0):
    """Message `i` of a receive batch as recvmmsg would leave it."""
    from linkpassd.adapters import mmsg
    off = i * batch.slot
    batch.payload[off:off + min(len(data), batch.slot)] = data[:batch.slot]
    mmsg.PORT_ADDR.pack_into(batch.names, i * mmsg.NAME_SIZE + 2, src[1], socket.inet_aton(src[0]))
    control, c = bytearray(), i * batch.control_slot
    if rx is not None:
        sec = int(rx)
        control += struct.pack("@Nii", 32, socket.SOL_SOCKET, echoresponder.SCM_TIMESTAMPNS)
        control += struct.pack("@qq", sec, int((rx - sec) * 1e9))
    if pktinfo is not None:
        ifindex, local = pktinfo
        control += struct.pack("@Nii", socket.CMSG_LEN(12), socket.IPPROTO_IP, echoresponder.IP_PKTINFO)
        control += struct.pack("@i4s4s", ifindex, socket.inet_aton(local), socket.inet_aton(local))
        control += bytes(4)  # CMSG_SPACE padding
    batch.control[c:c + len(control)] = control
    mmsg.RESULT.pack_into(batch.headers, i * mmsg.HEADER_SIZE + mmsg.RESULT_OFFSET,
                          len(control), flags, len(data))


def test_the_batched_responder_answers_like_the_single_one():
    """_answer_slot reads a recvmmsg slot (source, timestamp, pktinfo) and queues
    the reply in a sendmmsg batch: same policy, same reply, out of the
    interface and from the address the request came to."""
    from linkpassd.adapters import mmsg
    if not mmsg.available():
        pytest.skip("no sendmmsg/recvmmsg in this libc")
    r, heard = responder()
    got = mmsg.RecvBatch(8, 48, 64)
    replies = mmsg.SendBatch(8, echoresponder.PACKET.size, pktinfo=True)
    wall = time.time()
    _fill(got, 0, request(7), ("198.18.0.2", 40000), (5, "198.18.0.1"), rx=wall - 0.003)
    _fill(got, 1, request(8), ("198.18.0.2", 40000), (1, "127.0.0.1"))  # not a rail address
    _fill(got, 2, request(9), ("198.19.0.2", 40000), (5, "198.18.0.1"))  # not an allowed source
    _fill(got, 3, request(10) + b"\0", ("198.18.0.2", 40000), (5, "198.18.0.1"))  # too long
    _fill(got, 4, wire.EchoPacket(echoresponder.KIND_REPLY, 7, 1, 42).encode(), ("198.18.0.2", 4793),
          (5, "198.18.0.1"))  # a reply: never answered
    _fill(got, 5, bytes(48), ("198.18.0.2", 40000), (5, "198.18.0.1"), flags=socket.MSG_TRUNC)
    for i in range(6):
        r._answer_slot(got, i, replies, time.monotonic())
    c = r.counters
    assert (c.requests, c.refused_address, c.refused_source, c.malformed, c.ignored) == (1, 1, 1, 2, 1)
    assert replies.count == 1
    port, addr4 = mmsg.PORT_ADDR.unpack_from(replies.names, 2)
    assert (socket.inet_ntoa(addr4), port) == ("198.18.0.2", 40000)
    ifindex, local = struct.unpack_from("@i4s", replies.control, 16)
    assert (ifindex, socket.inet_ntoa(local)) == (5, "198.18.0.1")
    reply, why = wire.parse(bytes(replies.payload[:echoresponder.PACKET.size]))
    assert why == "" and (reply.kind, reply.seq, reply.sent_ns, reply.prober_id) == (
        echoresponder.KIND_REPLY, 7, 123456789, 42)
    assert reply.responder_id == r.responder_id and 2_500 <= reply.held_us <= 1_000_000
    r._hand_off(time.monotonic(), force=True)
    assert [list(h) for h in heard] == [[("198.18.0.1", "198.18.0.2")]]
