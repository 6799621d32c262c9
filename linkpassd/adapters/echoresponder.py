"""The echo responder: what every linkpassd answers.

The datagram's wire format is core.wire's (each caller imports it from there);
see adapters.echo for the protocol (port, admission,
timestamps). Kept apart from the probers (adapters.echo) so each module
stays readable.

Receipts (core.wire): per prober socket (its source address and port, the
address it sent to, its prober id) the responder counts the requests it
answers and puts the count in each reply, so the prober can tell a request
lost on the way here from a reply lost on the way back (core.direction).
The table is bounded (`_RECEIPT_KEYS`); when full it starts again, and the
probers see a count that does not add up and start again too.

One-way delay (core.wire, core.oneway): a request that carries its
prober's wall-clock send time is answered with our wall-clock receive time
(the kernel's) minus that, and our clock's error bound as of the batch
(`clock`, a reading the daemon refreshes: `set_clock`), in the same 40 bytes.
"""

from __future__ import annotations

import asyncio
import secrets
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from linkpassd.adapters import mmsg
from linkpassd.core.admission import ResponderPolicy, SourceLimiter
from linkpassd.core.oneway import NOT_CONFIGURED, ClockReading
from linkpassd.core.wire import (
    ECHO_PORT,
    HELD_BITS,
    KIND_REPLY,
    KIND_REQUEST,
    MAGIC,
    ONE_WAY_MARK,
    PACKET,
    RECEIPT_MODULO,
    RECEIPT_PRESENT,
    VERSION,
    one_way_field,
)

# Linux values Python's socket module does not name (asm-generic; x86-64 and arm64).
SO_TIMESTAMPNS = 35
SCM_TIMESTAMPNS = SO_TIMESTAMPNS
IP_PKTINFO = 8
_TIMESPEC = struct.Struct("@qq")
_PKTINFO = struct.Struct("@i4s4s")
_ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size) + socket.CMSG_SPACE(_PKTINFO.size)
_RECV_BYTES = 512  # more than a valid packet; longer ones are truncated and flagged
_RESPONDER_WAKE_S = 0.2  # the responder thread checks for close() this often
_HANDOFF_S = 0.010  # the responder hands what it heard to the loop at most this often
# The responder's receive queue: ~1,300 small datagrams, 25 ms of a 50,000/s
# flood, so a thread descheduled for a moment on a busy host still sees (and
# counts) what arrived meanwhile. Only a queue the thread cannot keep up with
# fills it; then requests wait at most this long, rather than being dropped.
_RESPONDER_RCVBUF = 1 << 20
SO_RCVBUFFORCE = 33
_U32 = struct.Struct("!I")
_MSG_TRUNC = int(socket.MSG_TRUNC)
_BATCH = 32  # requests read (and replies sent) per system call by the responder thread
_SLOT = 48  # bytes per received datagram: a valid one has 40; longer is malformed
_CONTROL = 64  # ancillary bytes per datagram: a timestamp and a pktinfo, 32 each
_CMSGHDR = struct.Struct("@Nii")
# Prober sockets the responder keeps receipts for; beyond, the table starts
# again (each prober socket is one rail of one peer, or one validation flow).
_RECEIPT_KEYS = 16384
_RECEIPT_MASK = RECEIPT_MODULO - 1


def _random_id() -> int:
    return secrets.randbits(64) or 1


def _udp_socket(netns: str | None) -> socket.socket:
    """A UDP socket in `netns` (None: ours). Sockets keep their namespace, so
    only creation needs to happen inside it."""
    if netns is None:
        return socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    from pyroute2.netns import create_socket
    return create_socket(netns, socket.AF_INET, socket.SOCK_DGRAM, flags=0)


def _cmsgs(ancdata) -> tuple[float | None, tuple[int, bytes] | None]:
    """(kernel receive time as unix seconds, (ifindex, local address)) when present."""
    rx, info = None, None
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPNS and len(payload) >= _TIMESPEC.size:
            sec, nsec = _TIMESPEC.unpack_from(payload)
            rx = sec + nsec * 1e-9
        elif level == socket.IPPROTO_IP and kind == IP_PKTINFO and len(payload) >= _PKTINFO.size:
            ifindex, spec_dst, _addr = _PKTINFO.unpack_from(payload)
            info = (ifindex, spec_dst)
    return rx, info


def open_socket(port: int = ECHO_PORT, address: str = "0.0.0.0",
                netns: str | None = None) -> socket.socket:
    """The responder's socket, bound: kernel receive timestamps, IP_PKTINFO
    (where each request was sent, to answer from there), a receive queue of
    `_RESPONDER_RCVBUF`. Raises OSError (port taken, no permission)."""
    sock = _udp_socket(netns)
    try:
        sock.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        try:  # beyond net.core.rmem_max needs CAP_NET_ADMIN, which the daemon has
            sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, _RESPONDER_RCVBUF)
        except PermissionError:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RESPONDER_RCVBUF)
        sock.bind((address, port))
    except BaseException:
        sock.close()
        raise
    return sock


def batch_buffers() -> tuple[mmsg.RecvBatch, mmsg.SendBatch]:
    """The responder's preallocated receive and reply batches (adapters.mmsg)."""
    return mmsg.RecvBatch(_BATCH, _SLOT, _CONTROL), mmsg.SendBatch(_BATCH, PACKET.size, pktinfo=True)


# --------------------------------------------------------------------------
# Responder
# --------------------------------------------------------------------------


@dataclass
class ResponderTally:
    """Written by the responder's thread only; read by the loop (plain ints: no handoff).
    The daemon reports them as core.model.ResponderCounters."""

    requests: int = 0  # well-formed requests from allowed sources to a rail address
    answered: int = 0
    refused_address: int = 0  # sent to a local address that is no rail's (loopback, management)
    refused_source: int = 0  # from a source neither in the fabric prefixes nor a probe peer
    rate_limited: int = 0  # the source's token bucket was empty
    malformed: int = 0
    ignored: int = 0  # well-formed but not a request: never answered
    send_errors: int = 0
    recv_errors: int = 0


HeardCallback = Callable[[dict[tuple[str, str], float]], None]


class EchoResponder:
    """Answers the requests its `policy` admits (core.admission), from the
    address each was sent to, out of the interface it came in on. One socket,
    bound to the wildcard address, for all rails: a rail address that appears
    late (or comes back) is answered at once, nothing to re-bind; requests to
    any other local address are seen, counted and dropped.

    It answers on its own thread, not on the event loop: a reply held up by
    our loop's work (a reconcile, a status request, a log burst) reads as
    path loss at the peer, and a peer whose rail has one live path left has
    no other path to vouch for us. The thread needs the GIL only briefly per
    datagram and releases it in every receive, so even a flood costs the loop
    little; the daemon lowers the interpreter's switch interval so the thread
    gets the GIL within a millisecond. Refused datagrams are dropped on the
    destination and source address alone, before any parsing. The thread
    hands the loop nothing per packet: counters are plain integers the loop
    reads, and which peers reached us (`on_heard`: {(our address, peer
    address): monotonic time}) is handed over at most every `_HANDOFF_S`."""

    def __init__(self, port: int = ECHO_PORT, address: str = "0.0.0.0", netns: str | None = None,
                 policy: ResponderPolicy | None = None, on_heard: HeardCallback | None = None,
                 responder_id: int | None = None):
        self.port = port
        self.address = address
        self.netns = netns
        self.policy = policy if policy is not None else ResponderPolicy()  # answers nobody
        self.limiter = SourceLimiter(*self.policy.limits)
        self.on_heard = on_heard
        self.responder_id = responder_id or _random_id()
        self.counters = ResponderTally()
        self.sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._heard: dict[tuple[str, str], float] = {}  # the thread's, until handed over
        self._receipts: dict[tuple, int] = {}  # the thread's: requests answered per prober socket
        self._handed_at = 0.0
        self.clock: ClockReading = NOT_CONFIGURED  # our clock's error bound (core.oneway)

    def set_clock(self, reading: ClockReading) -> None:
        """Our clock synchronisation's latest reading (one attribute: safe
        while the thread runs)."""
        self.clock = reading

    def set_policy(self, policy: ResponderPolicy) -> None:
        """Answer by a new policy from now on (a reload). Rate buckets are kept
        unless the rate limits changed. Safe while the thread runs: it reads
        both attributes once per datagram."""
        if policy.limits != self.policy.limits:
            self.limiter = SourceLimiter(*policy.limits)
        self.policy = policy

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        sock = open_socket(self.port, self.address, self.netns)
        sock.settimeout(_RESPONDER_WAKE_S)  # so close() is seen without a datagram
        self.sock = sock
        self._stop.clear()
        self._thread = threading.Thread(target=self._serve, args=(sock,),
                                        name=f"echo-responder-{self.port}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self.sock is None:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2 * _RESPONDER_WAKE_S + 1.0)
            self._thread = None
        self.sock.close()
        self.sock = None

    def _serve(self, sock: socket.socket) -> None:
        if mmsg.available():
            self._serve_batched(sock)
            return
        while not self._stop.is_set():
            try:
                data, ancdata, flags, src = sock.recvmsg(_RECV_BYTES, _ANCILLARY)
            except (TimeoutError, InterruptedError):
                self._hand_off(time.monotonic(), force=True)
                continue
            except OSError:
                if self._stop.is_set():
                    return
                self.counters.recv_errors += 1
                continue
            try:
                self._answer(data, ancdata, flags, src)
            except Exception:  # noqa: BLE001 - nothing from outside may end the responder
                self.counters.malformed += 1

    def _serve_batched(self, sock: socket.socket) -> None:
        """Up to _BATCH requests per recvmmsg, their replies in one sendmmsg
        (adapters.mmsg): three system calls per batch (with the wait) instead
        of two per request, and, since the prober sent them together, the
        replies reach it together too."""
        fd = sock.fileno()
        received, replies = batch_buffers()
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        wait_ms = int(_RESPONDER_WAKE_S * 1000)
        while not self._stop.is_set():
            try:
                ready = poller.poll(wait_ms)
            except InterruptedError:
                continue
            if not ready:
                self._hand_off(time.monotonic(), force=True)
                continue
            if not self.serve_batch(fd, received, replies) and self._stop.is_set():
                return

    def serve_batch(self, fd: int, received: mmsg.RecvBatch, replies: mmsg.SendBatch) -> bool:
        """Read up to a batch of requests from `fd` (readable) and answer
        them in one sendmmsg. False when the receive failed (counted)."""
        try:
            n = received.recv(fd)
        except OSError:
            self.counters.recv_errors += 1
            return False
        now = time.monotonic()
        bound = self.clock.bound_at(now)  # once per batch, for replies that ask for it
        for i in range(n):
            try:
                self._answer_slot(received, i, replies, now, bound)
            except Exception:  # noqa: BLE001 - nothing from outside may end the responder
                self.counters.malformed += 1
        if replies.count:
            queued = replies.count
            failed = len(replies.send(fd))
            self.counters.answered += queued - failed
            self.counters.send_errors += failed
        self._hand_off(now)
        return True

    def _answer_slot(self, batch: mmsg.RecvBatch, i: int, replies: mmsg.SendBatch,
                     now: float, bound: int | None = None) -> None:
        """Request `i` of a received batch: judged as `_answer` does, its reply
        queued in `replies` (out of the interface, from the address, it came to)."""
        controllen, flags, length = mmsg.RESULT.unpack_from(
            batch.headers, i * mmsg.HEADER_SIZE + mmsg.RESULT_OFFSET)
        sport, src4 = mmsg.PORT_ADDR.unpack_from(batch.names, i * mmsg.NAME_SIZE + 2)
        control, off = batch.control, i * _CONTROL
        end, rx, info, rx_ns = off + min(controllen, _CONTROL), None, None, 0
        while off + _CMSGHDR.size <= end:
            clen, level, kind = _CMSGHDR.unpack_from(control, off)
            if clen < _CMSGHDR.size or off + clen > end:
                break
            data = off + _CMSGHDR.size
            if kind == IP_PKTINFO and level == socket.IPPROTO_IP and clen >= 28:
                info = _PKTINFO.unpack_from(control, data)
            elif kind == SCM_TIMESTAMPNS and level == socket.SOL_SOCKET and clen >= 32:
                sec, nsec = _TIMESPEC.unpack_from(control, data)
                rx = sec + nsec * 1e-9
                rx_ns = sec * 1_000_000_000 + nsec
            off += (clen + 7) & ~7
        fields = (PACKET.unpack_from(batch.payload, i * _SLOT)
                  if not flags & _MSG_TRUNC and length == PACKET.size else None)
        held = self._judge(info, _U32.unpack(src4)[0], fields, rx, now)
        if held is None:
            return
        _m, _v, _k, _r, seq, sent_ns, prober_id, asked, _held = fields
        receipt = self._receipt((src4, sport, b"" if info is None else info[2], prober_id))
        rid = self.responder_id
        if asked:  # the prober's wall-clock send time: it asks for one-way delay
            rid = one_way_field((rx_ns or time.time_ns()) - asked, bound)
            held = ONE_WAY_MARK | min(held, HELD_BITS)
        j = (replies.add(src4, sport) if info is None  # as routed
             else replies.add(src4, sport, info[0], info[1]))
        PACKET.pack_into(replies.payload, j * PACKET.size, MAGIC, VERSION, KIND_REPLY, receipt,
                         seq, sent_ns, prober_id, rid, held)
        if replies.full:
            queued = replies.count
            failed = len(replies.send(self.sock.fileno()))
            self.counters.answered += queued - failed
            self.counters.send_errors += failed
        if info is not None and self.on_heard is not None:
            self._heard[(info[1], src4)] = now

    def _receipt(self, key: tuple) -> int:
        """The receipt field of the reply to a request from prober socket
        `key` (source address, source port, our address, prober id): how
        many of its requests we have answered, this one included (core.wire)."""
        receipts = self._receipts
        n = receipts.get(key)
        if n is None:
            if len(receipts) >= _RECEIPT_KEYS:
                receipts.clear()  # its probers see counts that do not add up, and start again
            n = 0
        n = (n + 1) & _RECEIPT_MASK
        receipts[key] = n
        return RECEIPT_PRESENT | n

    def _judge(self, info, source: int, fields: tuple | None, rx: float | None,
               now: float) -> int | None:
        """Whether to answer a datagram, counted: how long we held it (µs),
        or None. Cheapest first: where it was sent (`info`: IP_PKTINFO's
        (ifindex, local address, header destination)), who sent it (`source`,
        an IPv4 integer), whether they may; only then its contents (`fields`:
        the unpacked packet, None if its size is wrong)."""
        policy = self.policy
        if not policy.answers_to(b"" if info is None else info[2]):
            self.counters.refused_address += 1
            return None
        if not policy.allows(source):
            self.counters.refused_source += 1
            return None
        if fields is None:
            self.counters.malformed += 1
            return None
        magic, version, kind = fields[0], fields[1], fields[2]
        if magic != MAGIC or version != VERSION or kind not in (KIND_REQUEST, KIND_REPLY):
            self.counters.malformed += 1
            return None
        if kind != KIND_REQUEST:
            self.counters.ignored += 1
            return None
        self.counters.requests += 1
        if not self.limiter.allow(source, fields[6], now):  # per (source, prober id)
            self.counters.rate_limited += 1
            return None
        return 0 if rx is None else min(max(0, round((time.time() - rx) * 1e6)), 2**32 - 1)

    def _hand_off(self, now: float, force: bool = False) -> None:
        """Give the loop what was heard since the last hand-off, batched."""
        if not self._heard or (not force and now - self._handed_at < _HANDOFF_S):
            return
        raw, self._heard, self._handed_at = self._heard, {}, now
        if self.on_heard is None:
            return
        ntoa = socket.inet_ntoa
        heard = {(ntoa(local), ntoa(peer)): at for (local, peer), at in raw.items()}
        if self._thread is not None and self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self.on_heard, heard)
            except RuntimeError:  # the loop is closed: we are shutting down
                pass
        else:
            self.on_heard(heard)

    def _answer(self, data: bytes, ancdata, flags: int, src) -> None:
        """One datagram as recvmsg gives it (where mmsg is not available, and
        in tests): judged by `_judge`, answered with sendmsg."""
        info = None
        for level, kind, payload in ancdata:
            if kind == IP_PKTINFO and level == socket.IPPROTO_IP and len(payload) >= _PKTINFO.size:
                info = _PKTINFO.unpack_from(payload)  # (ifindex, local address, header destination)
                break
        src4 = socket.inet_aton(src[0])
        # parse()'s checks without building an EchoPacket (the int flag: the
        # enum's & costs as much again as the rest).
        fields = (PACKET.unpack(data) if not flags & _MSG_TRUNC and len(data) == PACKET.size
                  else None)
        now = time.monotonic()
        held = self._judge(info, _U32.unpack(src4)[0], fields, _cmsgs(ancdata)[0], now)
        if held is None:
            return
        _m, _v, _k, _r, seq, sent_ns, prober_id, asked, _held = fields
        receipt = self._receipt((src4, src[1], b"" if info is None else info[2], prober_id))
        rid = self.responder_id
        if asked:  # one-way delay (see serve_batch)
            rx = _cmsgs(ancdata)[0]
            rx_ns = round(rx * 1e9) if rx is not None else time.time_ns()
            rid = one_way_field(rx_ns - asked, self.clock.bound_at(now))
            held = ONE_WAY_MARK | min(held, HELD_BITS)
        reply = PACKET.pack(MAGIC, VERSION, KIND_REPLY, receipt, seq, sent_ns, prober_id,
                            rid, held)  # EchoPacket(...).encode()
        try:
            if info is None:
                self.sock.sendto(reply, src)
            else:
                ifindex, local, _dst = info
                pktinfo = _PKTINFO.pack(ifindex, local, bytes(4))
                self.sock.sendmsg([reply], [(socket.IPPROTO_IP, IP_PKTINFO, pktinfo)], 0, src)
            self.counters.answered += 1
        except OSError:
            self.counters.send_errors += 1
        if info is not None and self.on_heard is not None:
            self._heard[(info[1], src4)] = now
            self._hand_off(now)
