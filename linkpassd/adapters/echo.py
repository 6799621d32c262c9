"""UDP echo between linkpassd peers: a responder in every daemon, a prober per path.

The judgement lives in core.probe; this module only moves datagrams and time.

Port: UDP 4793 by default (configurable). The neighbours are taken, and a
probe must never be mistaken for them by a switch, NIC or capture filter:
3784/3785/4784 are BFD control/echo/multihop, 6784 BFD-on-LAG, 7784 S-BFD,
4789 VXLAN, 4790 VXLAN-GPE (so not 4790), 4791 RoCEv2, 4792 Unified Bus. 4793 was
unassigned in the IANA registry copy we checked (Wireshark 4.0's), sits next to
the RoCE ports an operator already opens in fabric ACLs, and lies below the
Linux ephemeral range (32768-60999), so no client socket can hold it.

Wire format, network byte order, 40 bytes, the same both ways:

    magic "LPEC" | version u8 (1) | kind u8 (1 request, 2 reply) | reserved u16
    seq u32 | sent_ns u64 (prober's clock, echoed) | prober_id u64 (echoed)
    responder_id u64 (0 in requests) | held_us u32 (0 in requests)

`held_us` is how long the responder's host held the request (kernel receive
to reply), so a late reply caused by a stalled peer daemon is not blamed on
the path. A reply is never larger than its request (no amplification), there
is at most one per request, and a responder never answers a reply (no loops
between responders). Anything else is dropped and counted, never raised.

The responder is not an open reflector (core.admission): it answers only
requests sent to a rail address, from a source in the fabric prefixes or a
configured peer, within a per-source rate. Refused datagrams are dropped
before they are parsed.

Each prober socket is bound to the rail's interface (SO_BINDTODEVICE) and
address and connected to the peer's responder, so the probe takes that rail
whatever the routing tables say, and an ICMP port unreachable (the peer host is
up, its daemon is not) comes back as ECONNREFUSED. The responder answers from
the address the request was sent to, out of the interface it came in on
(IP_PKTINFO), so the reply tests the same physical path back.

Time: probers use the event loop's monotonic clock. Replies carry the kernel's
receive time (SO_TIMESTAMPNS), so a busy loop does not make them late, and the
daemon's loop-lag meter (adapters.looplag, shared with BFD) says how late the
loop runs; both feed the core, which refuses to count a miss that a stall of
ours could explain.

IPv4 only for now.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import secrets
import socket
import struct
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from linkpassd.adapters.looplag import LoopLag
from linkpassd.core.admission import ResponderPolicy, SourceLimiter
from linkpassd.core.model import Assessment, ResponderCounters
from linkpassd.core.probe import PathState, Prober, ProbeConfig, Send

ECHO_PORT = 4793
MAGIC = b"LPEC"
VERSION = 1
KIND_REQUEST = 1
KIND_REPLY = 2
PACKET = struct.Struct("!4sBBHIQQQI")

# Linux values Python's socket module does not name (asm-generic; x86-64 and arm64).
SO_TIMESTAMPNS = 35
SCM_TIMESTAMPNS = SO_TIMESTAMPNS
IP_PKTINFO = 8
_TIMESPEC = struct.Struct("@qq")
_PKTINFO = struct.Struct("@i4s4s")
_ANCILLARY = socket.CMSG_SPACE(_TIMESPEC.size) + socket.CMSG_SPACE(_PKTINFO.size)
_RECV_BYTES = 512  # more than a valid packet; longer ones are truncated and flagged
_BATCH = 64  # datagrams handled per wake-up, so a flood cannot starve the loop
_MAX_KERNEL_DELAY_S = 1.0  # beyond this a receive timestamp is a clock step, not a delay
_RESPONDER_WAKE_S = 0.2  # the responder thread checks for close() this often
_RETRY_S = 1.0  # reopen a prober socket this long after it failed (port or address missing)
_SOCKET_GONE = (errno.ENODEV, errno.EADDRNOTAVAIL)
_HANDOFF_S = 0.010  # the responder hands what it heard to the loop at most this often
# The responder's receive queue: ~1,300 small datagrams, 25 ms of a 50,000/s
# flood, so a thread descheduled for a moment on a busy host still sees (and
# counts) what arrived meanwhile. Only a queue the thread cannot keep up with
# fills it; then requests wait at most this long, rather than being dropped.
_RESPONDER_RCVBUF = 1 << 20
SO_RCVBUFFORCE = 33
_U32 = struct.Struct("!I")
# Upper bounds of the probe RTT histogram (seconds; +Inf is implied), for metrics:
# each reply costs one bisect and one integer increment (see docs/metrics.md).
RTT_BUCKETS_S = (50e-6, 100e-6, 200e-6, 500e-6, 1e-3, 2e-3, 4e-3, 8e-3, 16e-3, 32e-3, 64e-3,
                 0.128, 0.256, 0.512, 1.024)


# --------------------------------------------------------------------------
# Packets
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class EchoPacket:
    kind: int
    seq: int
    sent_ns: int
    prober_id: int
    responder_id: int = 0
    held_us: int = 0

    def encode(self) -> bytes:
        return PACKET.pack(MAGIC, VERSION, self.kind, 0, self.seq, self.sent_ns,
                           self.prober_id, self.responder_id, self.held_us)


def parse(data: bytes, truncated: bool = False) -> tuple[EchoPacket | None, str]:
    """A packet, or None and why not. Never raises on any input."""
    if truncated or len(data) > PACKET.size:
        return None, "too long"
    if len(data) < PACKET.size:
        return None, "too short"
    magic, version, kind, _reserved, seq, sent_ns, prober_id, responder_id, held_us = \
        PACKET.unpack(data)
    if magic != MAGIC:
        return None, "bad magic"
    if version != VERSION:
        return None, f"version {version}"
    if kind not in (KIND_REQUEST, KIND_REPLY):
        return None, f"kind {kind}"
    return EchoPacket(kind, seq, sent_ns, prober_id, responder_id, held_us), ""


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
                 policy: ResponderPolicy | None = None, on_heard: HeardCallback | None = None):
        self.port = port
        self.address = address
        self.netns = netns
        self.policy = policy if policy is not None else ResponderPolicy()  # answers nobody
        self.limiter = SourceLimiter(*self.policy.limits)
        self.on_heard = on_heard
        self.responder_id = _random_id()
        self.counters = ResponderTally()
        self.sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._heard: dict[tuple[str, str], float] = {}  # the thread's, until handed over
        self._handed_at = 0.0

    def set_policy(self, policy: ResponderPolicy) -> None:
        """Answer by a new policy from now on (a reload). Rate buckets are kept
        unless the rate limits changed. Safe while the thread runs: it reads
        both attributes once per datagram."""
        if policy.limits != self.policy.limits:
            self.limiter = SourceLimiter(*policy.limits)
        self.policy = policy

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        sock = _udp_socket(self.netns)
        try:
            sock.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            try:  # beyond net.core.rmem_max needs CAP_NET_ADMIN, which the daemon has
                sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, _RESPONDER_RCVBUF)
            except PermissionError:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RESPONDER_RCVBUF)
            sock.bind((self.address, self.port))
            sock.settimeout(_RESPONDER_WAKE_S)  # so close() is seen without a datagram
        except BaseException:
            sock.close()
            raise
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

    def _hand_off(self, now: float, force: bool = False) -> None:
        """Give the loop what was heard since the last hand-off, batched."""
        if not self._heard or (not force and now - self._handed_at < _HANDOFF_S):
            return
        heard, self._heard, self._handed_at = self._heard, {}, now
        if self.on_heard is None:
            return
        if self._thread is not None and self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self.on_heard, heard)
            except RuntimeError:  # the loop is closed: we are shutting down
                pass
        else:
            self.on_heard(heard)

    def _answer(self, data: bytes, ancdata, flags: int, src) -> None:
        # Cheapest first: where it was sent, who sent it, whether they may; only then parse.
        policy = self.policy
        info = None
        for level, kind, payload in ancdata:
            if kind == IP_PKTINFO and level == socket.IPPROTO_IP and len(payload) >= _PKTINFO.size:
                info = _PKTINFO.unpack_from(payload)  # (ifindex, local address, header destination)
                break
        if not policy.answers_to(b"" if info is None else info[2]):
            self.counters.refused_address += 1
            return
        source = _U32.unpack(socket.inet_aton(src[0]))[0]
        if not policy.allows(source):
            self.counters.refused_source += 1
            return
        pkt, _why = parse(data, truncated=bool(flags & socket.MSG_TRUNC))
        if pkt is None:
            self.counters.malformed += 1
            return
        if pkt.kind != KIND_REQUEST:
            self.counters.ignored += 1
            return
        self.counters.requests += 1
        now = time.monotonic()
        if not self.limiter.allow(source, now):
            self.counters.rate_limited += 1
            return
        rx, _ = _cmsgs(ancdata)
        held = 0 if rx is None else min(max(0, round((time.time() - rx) * 1e6)), 2**32 - 1)
        reply = EchoPacket(KIND_REPLY, pkt.seq, pkt.sent_ns, pkt.prober_id,
                           self.responder_id, held).encode()
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
            self._heard[(socket.inet_ntoa(info[1]), src[0])] = now
            self._hand_off(now)


# --------------------------------------------------------------------------
# Prober
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbePath:
    """Probe `peer` from `source` on interface `port` (a rail's port and address)."""

    port: str
    source: str
    peer: str

    def __post_init__(self) -> None:
        for addr in (self.source, self.peer):
            if ipaddress.ip_address(addr).version != 4:
                raise ValueError(f"echo probes are IPv4 only for now, got {addr}")

    def __str__(self) -> str:
        return f"{self.port}:{self.source}->{self.peer}"


ChangeCallback = Callable[["EchoProber", Assessment], None]


class EchoProber:
    """One path: sends what the core asks, feeds back what comes in and how late
    the loop ran. `on_change` hears every change of the path's verdict."""

    def __init__(self, path: ProbePath, config: ProbeConfig | None = None, *,
                 echo_port: int = ECHO_PORT, tos: int = 0, netns: str | None = None,
                 lag: LoopLag | None = None, on_change: ChangeCallback | None = None,
                 prober_id: int | None = None,
                 on_reply_heard: Callable[["EchoProber", float], None] | None = None):
        self.path = path
        self.state = Prober(path.peer, config or ProbeConfig())
        self.echo_port = echo_port
        self.tos = tos
        self.netns = netns
        self.lag = lag
        self.on_change = on_change
        self.on_reply_heard = on_reply_heard  # (prober, kernel receive time): any reply of ours
        self.prober_id = prober_id or _random_id()
        self.socket_error = ""  # why the socket could not be opened, while it cannot
        self.icmp_errors = 0  # ICMP errors other than port unreachable (e.g. no ARP answer)
        self.rtt_counts = [0] * (len(RTT_BUCKETS_S) + 1)  # replies per RTT bucket, last: +Inf
        self.rtt_sum_s = 0.0
        self.sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._reported: tuple | None = None

    # ---- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self.lag is not None:
            self.lag.listeners.append(self._lagged)
        self._open()
        self._schedule()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._timer_at = None
        if self.lag is not None and self._lagged in self.lag.listeners:
            self.lag.listeners.remove(self._lagged)
        self._close_socket()

    def _open(self) -> None:
        try:
            sock = _udp_socket(self.netns)
        except OSError as exc:
            self.socket_error = f"socket: {exc}"
            return
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, self.path.port.encode())
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            if self.tos:
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, self.tos)
            sock.bind((self.path.source, 0))
            sock.connect((self.path.peer, self.echo_port))
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            self.socket_error = f"{self.path}: {exc.strerror or exc}"
            return
        self.socket_error = ""
        self.sock = sock
        self._loop.add_reader(sock.fileno(), self._readable)

    def _close_socket(self) -> None:
        if self.sock is not None:
            self._loop.remove_reader(self.sock.fileno())
            self.sock.close()
            self.sock = None

    # ---- what the daemon reads -------------------------------------------------

    @property
    def counters(self):
        return self.state.counters

    def assessment(self) -> Assessment:
        a = self.state.assessment()
        if self.socket_error:
            return Assessment(a.signal, a.severity, a.status,
                              f"{a.detail}; cannot probe: {self.socket_error}", a.confirmed)
        return a

    def peer_heard(self, at: float | None = None) -> None:
        """The peer's own probes reached our responder on this path (at `at`,
        monotonic time, which is the loop's clock; default now)."""
        self.state = self.state.peer_heard(self._loop.time() if at is None else at)

    # ---- the loop's callbacks ------------------------------------------------

    def _lagged(self, now: float, lag: float) -> None:
        self.state = self.state.note_lag(now, lag)

    def _current_lag(self, now: float, scheduled: float | None = None) -> float:
        lag = 0.0 if scheduled is None else max(0.0, now - scheduled)
        return max(lag, self.lag.current(now)) if self.lag is not None else lag

    def _on_timer(self, scheduled: float) -> None:
        self._timer = self._timer_at = None
        now = self._loop.time()
        lag = self._current_lag(now, scheduled)
        if self.lag is not None:
            self.lag.record(now, lag)
        if self.sock is None:
            self._open()
        # Replies already here are read before any deadline is judged.
        self._drain(now, lag)
        self.state, sends = self.state.poll(now, lag)
        for send in sends:
            self._send(send, now)
        self._after()

    def _readable(self) -> None:
        now = self._loop.time()
        self._drain(now, self._current_lag(now))
        self._after()

    def _drain(self, now: float, lag: float) -> None:
        if self.sock is None:
            return
        wall = time.time()
        for _ in range(_BATCH):
            try:
                data, ancdata, flags, _src = self.sock.recvmsg(_RECV_BYTES, _ANCILLARY)
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionRefusedError:
                self.state = self.state.on_refused(now)
                continue
            except OSError:
                self.icmp_errors += 1
                continue
            self._received(data, ancdata, flags, now, wall, lag)

    def _received(self, data: bytes, ancdata, flags: int, now: float, wall: float,
                  lag: float) -> None:
        pkt, _why = parse(data, truncated=bool(flags & socket.MSG_TRUNC))
        if pkt is None or pkt.kind != KIND_REPLY:
            self.state = self.state.count_malformed()
            return
        if pkt.prober_id != self.prober_id:  # e.g. answers to a previous daemon
            self.state = self.state.count_stray()
            return
        rx, _ = _cmsgs(ancdata)
        waited = 0.0 if rx is None else min(max(0.0, wall - rx), _MAX_KERNEL_DELAY_S)
        # The path's round trip: kernel receive time - our send time - what the peer held it.
        rtt = max(0.0, now - waited - pkt.sent_ns * 1e-9 - pkt.held_us * 1e-6)
        self.rtt_counts[bisect_left(RTT_BUCKETS_S, rtt)] += 1
        self.rtt_sum_s += rtt
        self.state = self.state.on_reply(pkt.seq, now - waited, now, max(lag, waited),
                                         echoed_sent_at=pkt.sent_ns * 1e-9,
                                         peer_delay_s=pkt.held_us * 1e-6)
        if self.on_reply_heard is not None:
            self.on_reply_heard(self, now - waited)

    def poke(self) -> None:
        """Send a witness probe now (see Prober.poke)."""
        now = self._loop.time()
        self.state, send = self.state.poke(now)
        self._send(send, now)
        self._schedule()

    def _send(self, send: Send, now: float) -> None:
        if self.sock is None:
            self.state = self.state.on_send_error(send.seq, now)
            return
        data = EchoPacket(KIND_REQUEST, send.seq, round(now * 1e9), self.prober_id).encode()
        try:
            self.sock.send(data)
        except ConnectionRefusedError:  # a pending ICMP error, reported on this send
            self.state = self.state.on_refused(now).on_send_error(send.seq, now)
        except OSError as exc:
            self.state = self.state.on_send_error(send.seq, now)
            if exc.errno in _SOCKET_GONE:  # the interface or address went away: reopen later
                self._close_socket()
                self.socket_error = f"{self.path}: {exc.strerror or exc}"

    def _after(self) -> None:
        # What the verdict depends on; the assessment (text) is built only on a change.
        key = (self.state.state, self.state.degraded, bool(self.socket_error))
        if key != self._reported:
            self._reported = key
            if self.on_change is not None:
                self.on_change(self, self.assessment())
        self._schedule()

    def _schedule(self) -> None:
        now = self._loop.time()
        when = max(self.state.next_wakeup(), now)
        if self.sock is None and self.socket_error:
            when = max(when, now + _RETRY_S)
        if self._timer is not None and self._timer_at == when:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = self._loop.call_at(when, self._on_timer, when)


# --------------------------------------------------------------------------
# What the daemon runs
# --------------------------------------------------------------------------


@dataclass
class EchoService:
    """One responder, one prober per path, as one task.

    `on_change(path, assessment)` is called on every verdict change (and once
    for each path `set_paths` removes); the daemon turns it into a queue event.
    The responder tells each prober when the peer's own probes reach us,
    which says which way a one-way fault runs.

    `lag`: the daemon's loop-lag meter, shared with BFD (adapters.looplag);
    the service sets its heartbeat to `lag_period_s` while it runs. Without
    one the service has its own. `responder_policy`: what the responder
    answers (core.admission); by default, on the paths' source addresses and
    only to their peers."""

    paths: Iterable[ProbePath]
    config: ProbeConfig = field(default_factory=ProbeConfig)
    echo_port: int = ECHO_PORT
    listen: str = "0.0.0.0"
    tos: int = 0
    respond: bool = True
    lag_period_s: float | None = 0.025  # the loop-lag heartbeat (see adapters.looplag)
    netns: str | None = None
    on_change: Callable[[ProbePath, Assessment], None] | None = None
    lag: LoopLag | None = None
    responder_policy: ResponderPolicy | None = None

    def __post_init__(self) -> None:
        self.paths = tuple(dict.fromkeys(self.paths))
        self._owns_lag = self.lag is None
        if self.lag is None:
            self.lag = LoopLag(period_s=self.lag_period_s, tolerance_s=self.config.lag_tolerance_s)
        self._prober_id = _random_id()
        self.probers: dict[ProbePath, EchoProber] = {p: self._prober(p) for p in self.paths}
        self._by_addresses = {(p.source, p.peer): pr for p, pr in self.probers.items()}
        policy = self.responder_policy or ResponderPolicy.build(
            {p.source for p in self.paths}, peers={p.peer for p in self.paths})
        self.responder = (EchoResponder(self.echo_port, self.listen, self.netns, policy=policy,
                                        on_heard=self._heard) if self.respond else None)
        self.responder_error = ""
        self._retry: asyncio.TimerHandle | None = None
        self._suspects: set[EchoProber] = set()  # paths confirming a loss right now
        self._started = False

    def _prober(self, path: ProbePath) -> EchoProber:
        return EchoProber(path, self.config, echo_port=self.echo_port, tos=self.tos,
                          netns=self.netns, lag=self.lag, prober_id=self._prober_id,
                          on_change=self._changed, on_reply_heard=self._reply_heard)

    def start(self) -> None:
        if self._owns_lag or not self.lag.started:
            self.lag.start()
        if not self._owns_lag:
            self.lag.heartbeat(self.lag_period_s)
        self._started = True
        self._start_responder()
        for prober in self.probers.values():
            prober.start()

    def close(self) -> None:
        for prober in self.probers.values():
            prober.close()
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self.responder is not None:
            self.responder.close()
        if self._owns_lag:
            self.lag.close()
        elif self._started:
            self.lag.heartbeat(None)  # the meter stays: BFD still records into it
        self._started = False

    def set_paths(self, paths: Iterable[ProbePath]) -> None:
        """Probe exactly `paths` from now on: new ones start (never up), gone
        ones stop, and those that stay keep everything they know (verdict,
        loss window, rise count, counters). For a reload whose peers changed;
        a change of timers, port or TOS needs a new service."""
        wanted = tuple(dict.fromkeys(paths))
        for path in [p for p in self.probers if p not in wanted]:
            prober = self.probers.pop(path)
            prober.close()
            self._suspects.discard(prober)
            if self.on_change is not None:
                self.on_change(path, prober.assessment())  # the owner re-reads that port
        for path in wanted:
            if path not in self.probers:
                prober = self.probers[path] = self._prober(path)
                if self._started:
                    prober.start()
        self.paths = wanted
        self._by_addresses = {(p.source, p.peer): pr for p, pr in self.probers.items()}

    def set_responder_policy(self, policy: ResponderPolicy) -> None:
        """Answer by `policy` from now on (rail addresses, prefixes, peers or rates changed)."""
        self.responder_policy = policy
        if self.responder is not None:
            self.responder.set_policy(policy)

    def _start_responder(self) -> None:
        """A port we cannot bind (taken) must not stop the daemon from
        probing and routing: say why, and try again."""
        self._retry = None
        if self.responder is None:
            return
        try:
            self.responder.start()
            self.responder_error = ""
        except OSError as exc:
            self.responder_error = f"echo responder on {self.listen}:{self.echo_port}: {exc}"
            self._retry = asyncio.get_running_loop().call_later(_RETRY_S, self._start_responder)

    async def run(self) -> None:
        """Probe until cancelled."""
        self.start()
        try:
            await asyncio.Event().wait()
        finally:
            self.close()

    def responder_counters(self) -> ResponderCounters | None:
        """The responder's counters as the daemon reports them (None: no responder)."""
        if self.responder is None:
            return None
        c = self.responder.counters
        return ResponderCounters(answered=c.answered, refused_address=c.refused_address,
                                 refused_source=c.refused_source, rate_limited=c.rate_limited,
                                 malformed=c.malformed + c.ignored)

    def assessments(self, port: str | None = None) -> tuple[Assessment, ...]:
        return tuple(pr.assessment() for p, pr in self.probers.items()
                     if port is None or p.port == port)

    def _changed(self, prober: EchoProber, assessment: Assessment) -> None:
        """Each path's other paths are its witnesses. When one starts
        confirming a loss, it is told whether any other path is live, and
        every live witness probes at once, so its confirmation can tell a
        dead path from a silent host (core.probe: Prober.witnessed). Only
        suspects hear of replies elsewhere: nothing is done per reply for
        the paths that are fine."""
        if prober.state.state is PathState.SUSPECT:
            live = [p for p in self.probers.values() if p is not prober
                    and p.state.state in (PathState.UP, PathState.SUSPECT)]
            prober.state = prober.state.witnessed(bool(live))
            self._suspects.add(prober)
            for other in live:
                if other.state.state is PathState.UP and other.sock is not None:
                    other.poke()
        else:
            self._suspects.discard(prober)
        if self.on_change is not None:
            self.on_change(prober.path, assessment)

    def _reply_heard(self, prober: EchoProber, received_at: float) -> None:
        for other in self._suspects:
            if other is not prober:
                other.state = other.state.witnessed(other.state.others_live, received_at)

    def _heard(self, heard: dict[tuple[str, str], float]) -> None:
        """The responder's batch: which peers' probes reached which of our addresses, when."""
        for pair, at in heard.items():
            prober = self._by_addresses.get(pair)
            if prober is not None and prober.sock is not None:
                prober.peer_heard(at)
