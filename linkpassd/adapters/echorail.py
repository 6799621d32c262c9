"""One UDP socket per rail for every echo path of that rail, and the outbox
that sends what a batch of work queued in one system call per rail.

Why one socket per rail and not one connected socket per path (issue 11):
with 256 paths, every reply woke the event loop for its own socket (an epoll
event, a callback, a receive, and a second receive to find the socket empty),
and every probe was a send of its own. Now a rail's probes due in the same
wake-up leave in one sendmmsg, and its replies are read in one recvmmsg per
wake-up (adapters.mmsg), however many peers answer.

What the connected sockets gave, kept:
* the rail: the socket sends out of the rail's interface (IP_UNICAST_IF,
  the same output interface SO_BINDTODEVICE would give) from the rail's
  address, so a probe takes that rail whatever the routing tables say. It
  is not bound to the interface for receiving: a reply comes back wherever
  the fabric routes the rail address, which is the rail itself unless
  linkpassd announced the address through another rail ([announce],
  docs/bgp.md). A socket bound to the device would drop those replies, and
  a rail whose address is detoured could never be found healthy again;
  the rail's link itself, both ways, is BFD's to judge;
* which peer: a reply is matched to its path by its source address (and
  must come from the echo port); anything else is counted and dropped;
* "port unreachable" per peer: an unconnected socket hears of ICMP errors
  only with IP_RECVERR, through its error queue, each with the original
  destination, so a refused probe is still told to its own path
  (ECONNREFUSED: the peer host is up, its daemon is not);
* the kernel's receive time of each reply (SO_TIMESTAMPNS).
"""

from __future__ import annotations

import asyncio
import errno
import socket
import struct
import time
from collections.abc import Callable
from typing import Protocol

from linkpassd.adapters.echoresponder import SCM_TIMESTAMPNS, SO_TIMESTAMPNS, _udp_socket
from linkpassd.adapters.mmsg import HEADER_SIZE, NAME_SIZE, PORT_ADDR, RESULT, RESULT_OFFSET, RecvBatch, SendBatch
from linkpassd.core.probe import Prober
from linkpassd.core.wire import KIND_REQUEST, MAGIC, PACKET, VERSION


class RailPath(Protocol):
    """A path on a rail's socket, as the socket sees it (adapters.echo's
    EchoProber is one): keyed by its peer's packed address, handed the
    replies and ICMP errors from that peer, told when its probes left."""

    peer4: bytes
    prober_id: int
    state: Prober

    def reply(self, fields: tuple, rx: float | None, now: float, wall: float,
              lag: float) -> None: ...
    def icmp_error(self, err: int | None, now: float) -> None: ...
    def send_failed(self, seq: int, at: float, err: int) -> None: ...
    def sent_late(self, seq: int, at: float) -> None: ...
    def after_change(self) -> None: ...

IP_RECVERR = 11  # Linux; the socket module does not name it
IP_UNICAST_IF = 50  # Linux; the ifindex goes in network byte order for IPv4
SIOCGIFINDEX = 0x8933
SO_RCVBUFFORCE = 33
MSG_ERRQUEUE = 0x2000
_SEND_BATCH = 64  # datagrams per sendmmsg (more are sent in further calls)
_RECV_BATCH = 64  # datagrams per recvmmsg
_RECV_CALLS = 4  # recvmmsg calls per wake-up at most: a flood cannot hold the loop
_RECV_SLOT = 48  # bytes per received datagram: a valid one has 40; longer is malformed
_CONTROL_SLOT = 64  # ancillary bytes per datagram: one timestamp (32 bytes)
_RCVBUF = 1 << 20  # ~100 ms of replies from 128 peers at 10 ms, so a stall drops none
_TIMESTAMP = struct.Struct("@Nii qq")  # cmsghdr (len, level, type) + struct timespec
_TIMESTAMP_LEN = _TIMESTAMP.size
_SOL_SOCKET = socket.SOL_SOCKET


def read_wall_offset_ns(tries: int = 3) -> int:
    """CLOCK_REALTIME - CLOCK_MONOTONIC in ns. The wall clock is read between
    two monotonic reads and set against their midpoint; of `tries` such
    brackets the narrowest counts. Two plain reads one after the other would
    put any preemption between them into the offset (seen: a one-way delay
    5 us off on a busy machine)."""
    best_gap, offset = -1, 0
    for _ in range(tries):
        before = time.monotonic_ns()
        wall = time.time_ns()
        after = time.monotonic_ns()
        if best_gap < 0 or after - before < best_gap:
            best_gap, offset = after - before, wall - (before + after) // 2
    return offset


def _ifindex(sock: socket.socket, name: str) -> int:
    """The ifindex of `name` in the socket's own network namespace (the
    daemon's may differ: if_nametoindex would ask that one)."""
    import fcntl

    req = struct.pack("16si", name.encode()[:15], 0)
    return struct.unpack("16si", fcntl.ioctl(sock.fileno(), SIOCGIFINDEX, req))[1]
_MSG_TRUNC = int(socket.MSG_TRUNC)
_SOCK_EXTENDED_ERR = struct.Struct("=IBBBBII")  # ee_errno, origin, type, code, pad, info, data
GONE = (errno.ENODEV, errno.EADDRNOTAVAIL)  # the interface or address went away


# A batch that left this much later than its probes were stamped is
# restamped; below it the stamp's error is far inside the reply wait.
RESTAMP_AFTER_S = 0.0002


class Outbox:
    """Rails with queued datagrams, sent when the current batch of work ends
    (`with outbox:` around a timer wake-up or a receive), or, for a send
    queued outside any, at the loop's next turn."""

    def __init__(self) -> None:
        self._rails: list[RailSocket] = []
        self._depth = 0
        self._handle: asyncio.Handle | None = None

    def __enter__(self) -> "Outbox":
        self._depth += 1
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.flush()

    def pending(self, rail: "RailSocket") -> None:
        """`rail` queued its first datagram since it last sent."""
        self._rails.append(rail)
        if self._depth == 0 and self._handle is None:
            self._handle = asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        rails, self._rails = self._rails, []
        for rail in rails:
            rail.flush()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._rails = []


class RailSocket:
    """The socket of one rail (`port`, `source`) and its paths, keyed by the
    peer's packed address. Opened by `open`; if the rail's interface or
    address is missing, `error` says why and the owner retries."""

    def __init__(self, port: str, source: str, echo_port: int, tos: int = 0,
                 netns: str | None = None, outbox: Outbox | None = None,
                 on_readable: Callable[["RailSocket"], None] | None = None):
        self.port, self.source, self.echo_port = port, source, echo_port
        self.tos, self.netns = tos, netns
        self.outbox = outbox if outbox is not None else Outbox()
        self.on_readable = on_readable  # the owner reads, so it can judge after
        self.sock: socket.socket | None = None
        self.error = ""  # why the socket could not be opened, while it cannot
        self.opened_at: float | None = None  # loop time of the last attempt
        self.by_peer: dict[bytes, RailPath] = {}
        self.foreign = 0  # datagrams from no peer of ours (or not from its echo port)
        # How well batching works (logged when the daemon stops): system calls
        # that sent or received, and the datagrams they carried.
        self.send_calls = self.sent = self.recv_calls = self.received = 0
        self._sends = SendBatch(_SEND_BATCH, PACKET.size)
        self._queued: list[tuple[RailPath, int, float]] = []  # per slot: prober, seq, now
        self._recv = RecvBatch(_RECV_BATCH, _RECV_SLOT, _CONTROL_SLOT)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd = -1
        self.wall_offset_ns = 0  # CLOCK_REALTIME - CLOCK_MONOTONIC, read per send batch

    def __repr__(self) -> str:
        return f"RailSocket({self.port}:{self.source}, {len(self.by_peer)} peers)"

    # ---- paths ---------------------------------------------------------------

    def attach(self, prober: "RailPath") -> None:
        self.by_peer[prober.peer4] = prober

    def detach(self, prober: "RailPath") -> None:
        key = prober.peer4
        if self.by_peer.get(key) is prober:
            del self.by_peer[key]

    # ---- lifecycle -----------------------------------------------------------

    def open(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Open the socket (a no-op if open); False, with `error` set, if it cannot be."""
        self._loop = loop
        if self.sock is not None:
            return True
        self.opened_at = loop.time()
        try:
            sock = _udp_socket(self.netns)
        except OSError as exc:
            self.error = f"socket: {exc}"
            return False
        try:
            sock.setsockopt(socket.IPPROTO_IP, IP_UNICAST_IF,
                            struct.pack("!I", _ifindex(sock, self.port)))
            sock.setsockopt(_SOL_SOCKET, SO_TIMESTAMPNS, 1)
            sock.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
            try:  # beyond net.core.rmem_max needs CAP_NET_ADMIN, which the daemon has
                sock.setsockopt(_SOL_SOCKET, SO_RCVBUFFORCE, _RCVBUF)
            except PermissionError:
                sock.setsockopt(_SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF)
            if self.tos:
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, self.tos)
            sock.bind((self.source, 0))
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            self.error = f"{self.port}:{self.source}: {exc.strerror or exc}"
            return False
        self.error = ""
        self.sock, self._fd = sock, sock.fileno()
        if self.on_readable is not None:
            loop.add_reader(self._fd, self.on_readable, self)
        return True

    def close(self, error: str = "") -> None:
        """Close the socket; `error`: why (it stays closed until reopened)."""
        self._queued.clear()
        self._sends.clear()
        if self.sock is not None:
            if self._loop is not None and self.on_readable is not None:
                self._loop.remove_reader(self._fd)
            self.sock.close()
            self.sock, self._fd = None, -1
        self.error = error

    # ---- sending ---------------------------------------------------------------

    def queue(self, prober: "RailPath", seq: int, now: float) -> None:
        """Send probe `seq` of `prober`, stamped `now`, with the rail's next
        batch. The request also carries the wall-clock time it stands for
        (core.wire: one-way delay), from the offset between the two clocks
        read once per batch."""
        batch = self._sends
        i = batch.add(prober.peer4, self.echo_port)
        if i == 0:
            self.wall_offset_ns = read_wall_offset_ns()
        sent_ns = round(now * 1e9)
        PACKET.pack_into(batch.payload, i * PACKET.size, MAGIC, VERSION, KIND_REQUEST, 0, seq,
                         sent_ns, prober.prober_id, sent_ns + self.wall_offset_ns, 0)
        self._queued.append((prober, seq, now))
        if i == 0:
            self.outbox.pending(self)
        if batch.full:
            self.flush()

    def flush(self) -> None:
        """Send what is queued: one system call for up to 64 datagrams."""
        if not self._queued:
            return
        queued, self._queued = self._queued, []
        if self.sock is None:
            self._sends.clear()
            failures = [(i, errno.EBADF) for i in range(len(queued))]
        else:
            failures = self._sends.send(self._fd)
            self.send_calls += 1
            self.sent += len(queued) - len(failures)
            left = time.monotonic()  # the loop's clock
            if left - queued[0][2] > RESTAMP_AFTER_S:
                # The batch left later than it was stamped (a stall between the
                # two): a probe's silence counts from when it left (core.probe).
                for prober, seq, _at in queued:
                    prober.sent_late(seq, left)
        if not failures:
            return
        gone = ""
        for i, err in failures:
            prober, seq, at = queued[i]
            prober.send_failed(seq, at, err)
            if err in GONE and not gone:
                gone = f"{self.port}:{self.source}: {errno.errorcode.get(err, err)}"
        if gone:  # reopened by the owner when the interface or address is back
            self.close(gone)
        for prober, _seq, _at in queued:
            prober.after_change()

    # ---- receiving -------------------------------------------------------------

    def drain(self, now: float, wall: float, lag: float,
              readable: bool = False) -> list["RailPath"]:
        """Read every waiting reply (up to a bound) and hand each to its path;
        returns the paths that heard something (the owner then lets each
        judge and reschedule once). `now` is loop time, `wall` the unix time
        read with it (receive timestamps are unix time), `lag` how late the
        loop is running. `readable`: the loop said the socket is ready; if
        it holds no datagram, an ICMP error is waiting in its error queue
        (which must be read, or the socket stays ready for ever)."""
        touched: list[RailPath] = []
        if self.sock is None:
            return touched
        batch, fd, by_peer, echo_port = self._recv, self._fd, self.by_peer, self.echo_port
        headers, names, payload, control = batch.headers, batch.names, batch.payload, batch.control
        unpack_result, unpack_source = RESULT.unpack_from, PORT_ADDR.unpack_from
        unpack_packet, unpack_stamp = PACKET.unpack_from, _TIMESTAMP.unpack_from
        for call in range(_RECV_CALLS):
            try:
                n = batch.recv(fd)
            except OSError:  # a pending ICMP error: its details are in the error queue
                touched += self.read_errors(now)
                continue
            if n == 0:
                if call == 0 and readable:
                    touched += self.read_errors(now)
                break
            self.recv_calls += 1
            self.received += n
            for i in range(n):
                controllen, flags, length = unpack_result(headers, i * HEADER_SIZE + RESULT_OFFSET)
                sport, addr4 = unpack_source(names, i * NAME_SIZE + 2)
                prober = by_peer.get(addr4)
                if prober is None or sport != echo_port:
                    self.foreign += 1
                    continue
                touched.append(prober)
                if flags & _MSG_TRUNC or length != PACKET.size:
                    prober.state.count_malformed()
                    continue
                rx = None
                if controllen >= _TIMESTAMP_LEN:
                    _l, level, kind, sec, nsec = unpack_stamp(control, i * _CONTROL_SLOT)
                    if level == _SOL_SOCKET and kind == SCM_TIMESTAMPNS:
                        rx = sec + nsec * 1e-9
                prober.reply(unpack_packet(payload, i * _RECV_SLOT), rx, now, wall, lag)
            if n < _RECV_BATCH:
                break
        else:
            touched += self.read_errors(now)  # a full bound: errors may wait behind the data
        return touched

    def read_errors(self, now: float) -> list["RailPath"]:
        """Read the error queue (IP_RECVERR): each ICMP error names the probe's
        destination, so it is told to that path."""
        touched: list[RailPath] = []
        sock = self.sock
        if sock is None:
            return touched
        for _ in range(_RECV_BATCH):
            try:
                _data, ancdata, _flags, addr = sock.recvmsg(PACKET.size, 256, MSG_ERRQUEUE)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            err = None
            for level, kind, payload in ancdata:
                if level == socket.IPPROTO_IP and kind == IP_RECVERR \
                        and len(payload) >= _SOCK_EXTENDED_ERR.size:
                    err = _SOCK_EXTENDED_ERR.unpack_from(payload)[0]
            prober = None
            if addr and isinstance(addr, tuple):
                try:
                    prober = self.by_peer.get(socket.inet_aton(addr[0]))
                except OSError:
                    prober = None
            if prober is None:
                self.foreign += 1
                continue
            prober.icmp_error(err, now)
            touched.append(prober)
        return touched
