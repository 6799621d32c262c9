"""UDP echo between linkpassd peers: a responder in every daemon, a prober per path.

The judgement lives in core.probe; this module only moves datagrams and time.

Port: UDP 4793 by default (configurable). The neighbours are taken, and a
probe must never be mistaken for them by a switch, NIC or capture filter:
3784/3785/4784 are BFD control/echo/multihop, 6784 BFD-on-LAG, 7784 S-BFD,
4789 VXLAN, 4790 VXLAN-GPE (so not 4790), 4791 RoCEv2, 4792 Unified Bus. 4793 was
unassigned in the IANA registry copy we checked (Wireshark 4.0's), sits next to
the RoCE ports an operator already opens in fabric ACLs, and lies below the
Linux ephemeral range (32768-60999), so no client socket can hold it.

Wire format: core.wire, the one definition (40 bytes, the same both ways;
replies carry the responder's receipt, which says which way a path loses
packets: core.direction).

`held_us` is how long the responder's host held the request (kernel receive
to reply), so a late reply caused by a stalled peer daemon is not blamed on
the path. A reply is never larger than its request (no amplification), there
is at most one per request, and a responder never answers a reply (no loops
between responders). Anything else is dropped and counted, never raised.

The responder is not an open reflector (core.admission): it answers only
requests sent to a rail address, from a source in the fabric prefixes or a
configured peer, within a per-source rate. Refused datagrams are dropped
before they are parsed.

Every path of a rail (one per peer) shares the rail's one socket
(adapters.echorail), which sends out of the rail's interface (IP_UNICAST_IF)
from its address, so a probe takes that rail whatever the routing tables
say, and takes a reply from whichever port the fabric delivers the rail
address to (another rail's, while linkpassd announces it there); a reply
is matched to its path by its source address. The probes of a rail due in
one wake-up leave in one sendmmsg, its replies are read in one recvmmsg
(adapters.mmsg), and an ICMP port unreachable (the peer host is up, its
daemon is not) still reaches its own path, through the socket's error queue
(IP_RECVERR). The responder answers from the address the request was sent
to, out of the interface it came in on (IP_PKTINFO), so the reply tests the
same physical path back; it too reads and answers in batches.

Time: probers use the event loop's monotonic clock; the service's one timer
is a timerfd (adapters.timerfd) with a quarter-millisecond grain, since
asyncio's timers fire up to a millisecond late. What makes a stall of ours
harmless (core.probe has the contract): replies carry the kernel's receive
time (SO_TIMESTAMPNS); every rail's socket is read before anything is
judged, with `now` taken before the read; and a batch of probes that left
late is restamped with the time it left (adapters.echorail). How late the
loop ran is recorded for operators, never used as evidence.

Cost per probe is constant, whatever the number of paths: one timer for the
service (adapters.wakeups), paths due in the same grain run in one wake-up,
at most 32 per wake-up, so a backlog is worked off in slices with carrier and
BFD events in between; the service spreads its paths over one interval and
each keeps its phase; with 16 paths or more, those due within one send slot
(a tenth of the interval, at most 5 ms) leave together at its start
(core.schedule.send_slot); one socket per rail, batched both ways; and the
core's prober changes in place. A path's confirmation probes (core.probe)
are `confirm_probes` spread over the tolerance, only while it is silent.

Why UDP to a responder and not ICMP echo answered by the peer's kernel: the
kernel would answer at no userspace cost on the far side (the responder costs
~25 us of CPU per request, measured), and its receive timestamps are the same
SO_TIMESTAMPNS ones (per packet, whatever the protocol). But UDP keeps what
the judgement and the fabric need: a UDP 5-tuple, so a probe hashes across
ECMP as a RoCEv2 flow (UDP 4791) does, where ICMP has no ports to hash on and
is often rate-limited or filtered by fabric ACLs; the admission policy (no
open reflector); `held_us`, so a stalled peer is not blamed on the path; and
`peer_heard`, which says which way a one-way fault runs. Hence UDP; ICMP stays a possible fallback towards
hosts without linkpassd.

IPv4 only for now.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import random
import socket
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from linkpassd.adapters.echorail import Outbox, RailSocket
from linkpassd.adapters.echoresponder import (
    ECHO_PORT,
    KIND_REPLY,
    MAGIC,
    PACKET,
    VERSION,
    EchoResponder,
    _cmsgs,
    _random_id,
)
from linkpassd.adapters.looplag import LoopLag
from linkpassd.adapters.wakeups import SharedTimer
from linkpassd.core.admission import ResponderPolicy
from linkpassd.core.model import Assessment, ResponderCounters
from linkpassd.core.oneway import NOT_CONFIGURED, ClockReading
from linkpassd.core.probe import RTT_BUCKETS_S, ProbeConfig, Prober, Send, rail_ask_due
from linkpassd.core.schedule import send_slot
from linkpassd.core.wire import (
    HELD_BITS,
    MARK_BITS,
    ONE_WAY_MARK,
    RECEIPT_MODULO,
    RECEIPT_PRESENT,
    one_way_values,
)

RECEIPT_COUNT = RECEIPT_MODULO - 1  # the receipt field's count bits (core.wire)

_MAX_KERNEL_DELAY_S = 1.0  # beyond this a receive timestamp is a clock step, not a delay
_RETRY_S = 1.0  # reopen a rail's socket this long after it failed (port or address missing)
_MSG_TRUNC = int(socket.MSG_TRUNC)  # a plain int: the enum's & costs more than the rest of a check


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
    """One path of an EchoService: sends what the core asks and feeds back
    what comes in. `on_change` hears every change of the path's verdict.

    The service hands it the rest: `rail`, the socket of the path's rail,
    shared with the rail's other paths (adapters.echorail), which the
    service opens and closes; `timer`, the service's one timer for all its
    paths (adapters.wakeups); `read_first(now)`, which reads every socket
    before anything is judged and returns the time as of which every reply
    the kernel held has been read: the judgement is made as of then, so a
    reply that arrived after it is never judged missing. How late the loop
    ran is recorded for operators (Prober.stall_max_s), never used as
    evidence."""

    def __init__(self, path: ProbePath, config: ProbeConfig | None = None, *,
                 rail: RailSocket, timer: SharedTimer, read_first: Callable[[float], float],
                 on_change: ChangeCallback | None = None, prober_id: int | None = None):
        self.path = path
        self.peer4 = socket.inet_aton(path.peer)
        self.state = Prober(path.peer, config or ProbeConfig())
        self.on_change = on_change
        self.prober_id = prober_id or _random_id()
        self.icmp_errors = 0  # ICMP errors other than port unreachable (e.g. no ARP answer)
        self.rtt_counts = [0] * (len(RTT_BUCKETS_S) + 1)  # replies per RTT bucket, last: +Inf
        self.rtt_sum_s = 0.0
        self.send_slot_s = 0.0  # the steady probe goes at the start of its slot (core.probe: poll)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.rail: RailSocket | None = rail
        rail.attach(self)
        self.read_first = read_first
        self.timer = timer
        self._reported: tuple | None = None
        # A silence of this path asks its rail's other paths to probe (core.probe: asks_rail).
        self.on_rail_silence: Callable[["EchoProber", float], None] | None = None
        # Our clock's error bound, for one-way delay (the service's: core.oneway).
        self.own_clock: Callable[[], ClockReading] = lambda: NOT_CONFIGURED

    # ---- lifecycle ----------------------------------------------------------

    def start(self, first_at: float | None = None) -> None:
        """Probe, the first time at `first_at` (loop time; default now). That
        sets the path's phase, which it keeps (core.probe: poll), even when
        the loop runs late for the first one: the service spreads its paths'
        probes over one interval this way."""
        self._loop = asyncio.get_running_loop()
        if first_at is not None and self.state.next_send is None:
            self.state.next_send = first_at
        self._schedule()

    def close(self) -> None:
        self.timer.discard(self)
        if self.rail is not None:
            self.rail.detach(self)
            self.rail = None

    # ---- what the daemon reads -------------------------------------------------

    @property
    def sock(self) -> socket.socket | None:
        """The rail's socket, while it is open."""
        return self.rail.sock if self.rail is not None else None

    @property
    def socket_error(self) -> str:
        """Why the rail's socket cannot be opened, while it cannot."""
        return self.rail.error if self.rail is not None else ""

    @property
    def counters(self):
        return self.state.counters

    def assessment(self) -> Assessment:
        a = self.state.assessment()
        now = self._loop.time() if self._loop is not None else self.state.now
        one_way = self.state.oneway.report(self.own_clock(), now)
        if self.socket_error:
            return Assessment(a.signal, a.severity, a.status,
                              f"{a.detail}; cannot probe: {self.socket_error}", a.confirmed,
                              a.direction, one_way)
        return replace(a, one_way=one_way)

    def peer_heard(self, at: float | None = None) -> None:
        """The peer's own probes reached our responder on this path (at `at`,
        monotonic time, which is the loop's clock; default now)."""
        self.state.peer_heard(self._loop.time() if at is None else at)

    # ---- the loop's callbacks ------------------------------------------------

    def due(self, now: float, lag: float) -> None:
        """The timer's call: a send is due or a judgement (`lag`: how late the
        loop woke, recorded for operators)."""
        now = self._loop.time()  # taken before the sockets are read: see read_first
        rail = self.rail
        if rail is not None and rail.sock is None and (
                rail.opened_at is None or now - rail.opened_at >= _RETRY_S):
            rail.open(self._loop)
        state = self.state
        if lag > state.stall_max_s:
            state.note_stall(lag)
        # Replies already here are read before anything is judged (only then:
        # a wake-up that only sends has nothing to read first), and the
        # judgement is as of that read, which may have been a moment ago.
        judged_at = self.read_first(now) if state.deadline_passed(now) else now
        _, sends = state.poll(now, self.send_slot_s, judged_at)
        for send in sends:
            self._send(send, now)
        if self.on_rail_silence is not None and state.asks_rail(now):
            self.on_rail_silence(self, now)
        self._after()

    def probe_now(self, now: float) -> None:
        """Probe now, ahead of the schedule: another path of the rail went silent."""
        send = self.state.probe_now(now)
        if send is not None:
            self._send(send, now)
            self._schedule()

    def reply(self, fields: tuple, rx: float | None, now: float, wall: float,
              lag: float) -> None:
        """A datagram from our peer's echo port, unpacked (PACKET), with the
        kernel's receive time `rx` (unix time) if known: the hot path of
        every reply (the rail checked its size and source)."""
        magic, version, kind, receipt, seq, sent_ns, prober_id, one_way, held_us = fields
        if magic != MAGIC or version != VERSION or kind != KIND_REPLY:
            self.state.count_malformed()
            return
        if prober_id != self.prober_id:  # e.g. answers to a previous daemon
            self.state.count_stray()
            return
        marked = held_us & MARK_BITS == ONE_WAY_MARK  # one-way fields (core.wire)
        if marked:
            held_us &= HELD_BITS
        waited = 0.0 if rx is None else min(max(0.0, wall - rx), _MAX_KERNEL_DELAY_S)
        sent_at, held = sent_ns * 1e-9, held_us * 1e-6
        received = now - waited
        # The path's round trip: kernel receive time - our send time - what the peer held it.
        rtt = received - sent_at - held
        if marked:
            forward_ns, peer_bound = one_way_values(one_way)
            self.state.oneway.add(forward_ns, self._wall_round_trip_ns(rx, sent_ns, held_us, rtt),
                                  peer_bound)
        else:
            self.state.oneway.plain += 1
        if rtt < 0.0:
            rtt = 0.0
        self.rtt_counts[bisect_left(RTT_BUCKETS_S, rtt)] += 1
        self.rtt_sum_s += rtt
        self.state.on_reply(seq, received, sent_at, held,
                            receipt & RECEIPT_COUNT if receipt & RECEIPT_PRESENT else None)

    def _wall_round_trip_ns(self, rx: float | None, sent_ns: int, held_us: int,
                            rtt: float) -> int:
        """The round trip one-way delay splits, in the clock the peer's forward
        delay was measured against: our kernel's receive stamp less the wall
        time the request carried (RailSocket.queue), less the peer's hold.
        The loop-time `rtt` pairs loop time with a wall-clock read taken
        after it; whatever ran (or preempted us) between those two reads
        would be taken from the way back. Without a stamp: `rtt`."""
        rail = self.rail
        if rx is None or rail is None or not rail.wall_offset_ns:
            return round(rtt * 1e9)
        return round(rx * 1e9) - (sent_ns + rail.wall_offset_ns) - held_us * 1000

    def _received(self, data: bytes, ancdata, flags: int, now: float, wall: float,
                  lag: float) -> None:
        """One datagram as recvmsg gives it (data, ancillary data, flags)."""
        if flags & _MSG_TRUNC or len(data) != PACKET.size:
            self.state.count_malformed()
            return
        rx, _ = _cmsgs(ancdata)
        self.reply(PACKET.unpack(data), rx, now, wall, lag)

    def icmp_error(self, err: int | None, now: float) -> None:
        """An ICMP error for a probe of ours (the rail's error queue): port
        unreachable means the peer host is up and its daemon is not."""
        if err == errno.ECONNREFUSED:
            self.state.on_refused(now)
        else:
            self.icmp_errors += 1

    def send_failed(self, seq: int, at: float, err: int) -> None:
        """The kernel refused to send probe `seq` (stamped `at`): no evidence either way."""
        self.state.on_send_error(seq, at)

    def sent_late(self, seq: int, at: float) -> None:
        """Probe `seq` left the host at `at`, later than it was stamped."""
        self.state.restamp(seq, at)

    def _send(self, send: Send, now: float) -> None:
        rail = self.rail
        if rail is None or rail.sock is None:
            self.state.on_send_error(send.seq, now)
            return
        rail.queue(self, send.seq, now)

    def _after(self) -> None:
        state = self.state
        # What the verdict depends on; the assessment (text) is built only on a change.
        key = (state.state, state.degraded, bool(self.socket_error))
        if key != self._reported:
            self._reported = key
            if self.on_change is not None:
                self.on_change(self, self.assessment())
        self._schedule()

    after_change = _after

    def _schedule(self) -> None:
        rail = self.rail
        if rail is None:  # closed
            return
        now = self._loop.time()
        when = self.state.next_wakeup(self.send_slot_s)
        if when < now:
            when = now
        if rail.sock is None and rail.error:
            when = max(when, now + _RETRY_S)
        self.timer.set(self, when)


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
    clock: ClockReading = NOT_CONFIGURED  # our clock's error bound (set_clock), core.oneway

    def __post_init__(self) -> None:
        self.paths = tuple(dict.fromkeys(self.paths))
        self._owns_lag = self.lag is None
        if self.lag is None:
            self.lag = LoopLag(period_s=self.lag_period_s, tolerance_s=self.config.lag_tolerance_s)
        # One loop timer for every path; the probes its runs queue leave
        # together, one sendmmsg per rail, when the wake-up ends.
        self.outbox = Outbox()
        self.timer = SharedTimer(self.lag, batch=self.outbox)
        self.sockets: dict[tuple[str, str], RailSocket] = {}  # (port, source): the rail's socket
        self._read_at = -1  # the timer wake-up at which every rail was last read...
        self._read_now = 0.0  # ...and the time as of which it was
        self._loop: asyncio.AbstractEventLoop | None = None
        self._prober_id = _random_id()
        self.probers: dict[ProbePath, EchoProber] = {p: self._prober(p) for p in self.paths}
        self._by_addresses = {(p.source, p.peer): pr for p, pr in self.probers.items()}
        policy = self.responder_policy or ResponderPolicy.build(
            {p.source for p in self.paths}, peers={p.peer for p in self.paths})
        self.responder = (EchoResponder(self.echo_port, self.listen, self.netns, policy=policy,
                                        on_heard=self._heard) if self.respond else None)
        if self.responder is not None:
            self.responder.set_clock(self.clock)
        self.responder_error = ""
        self._retry: asyncio.TimerHandle | None = None
        self._assessed: dict[ProbePath, Assessment] = {}  # as of each path's last change
        self._rail_asked: dict[str, float] = {}  # port -> when a silence last asked its paths
        self._started = False

    def own_clock(self) -> ClockReading:
        """Our clock's error bound, as last read (core.oneway)."""
        return self.clock

    def set_clock(self, reading: ClockReading) -> None:
        """The clock synchronisation's newest reading: the probers' one-way
        delays are bounded by it, and our responder (if we run one) sends it."""
        self.clock = reading
        if self.responder is not None:
            self.responder.set_clock(reading)

    def _prober(self, path: ProbePath) -> EchoProber:
        key = (path.port, path.source)
        rail = self.sockets.get(key)
        if rail is None:
            rail = self.sockets[key] = RailSocket(path.port, path.source, self.echo_port,
                                                  self.tos, self.netns, self.outbox,
                                                  on_readable=self._readable)
        prober = EchoProber(path, self.config, rail=rail, timer=self.timer,
                            read_first=self._read_all, on_change=self._changed,
                            prober_id=self._prober_id)
        prober.on_rail_silence = self._rail_silence
        prober.own_clock = self.own_clock
        return prober

    def _rail_silence(self, silent: EchoProber, now: float) -> None:
        """A path's silence has lasted a quarter of the tolerance: the other
        paths of its rail probe now (core.probe: asks_rail), at most once per
        tolerance per rail. Their probes leave in the same batch."""
        port = silent.path.port
        if not rail_ask_due(self._rail_asked.get(port), now, self.config):
            return
        self._rail_asked[port] = now
        for path, prober in self.probers.items():
            if path.port == port and prober is not silent and prober.sock is not None:
                prober.probe_now(now)

    def _set_send_slot(self) -> None:
        slot = send_slot(self.config.interval_s, len(self.probers))
        for prober in self.probers.values():
            prober.send_slot_s = slot

    def _readable(self, rail: RailSocket) -> None:
        """A rail's socket has replies (or an ICMP error): read them all."""
        now = self._loop.time()
        # The timer is re-armed once for all the paths the replies moved.
        with self.outbox, self.timer.held():
            for prober in rail.drain(now, time.time(), 0.0, readable=True):
                prober.after_change()

    def _read_all(self, now: float) -> float:
        """Before a wake-up judges anything: every rail's replies up to `now`,
        once per wake-up (the rails share one timer). Returns the time as of
        which they were read: a later path of the same wake-up is judged as
        of that first read, not of its own (later) now."""
        if self._read_at == self.timer.wakeups:
            return self._read_now
        self._read_at, self._read_now = self.timer.wakeups, now
        wall = time.time()
        for rail in list(self.sockets.values()):
            for prober in rail.drain(now, wall, 0.0):
                prober.after_change()
        return now

    def start(self) -> None:
        if self._owns_lag or not self.lag.started:
            self.lag.start()
        if not self._owns_lag:
            self.lag.heartbeat(self.lag_period_s)
        self._started = True
        self._start_responder()
        # Spread the paths' probes evenly over one interval, and they stay
        # spread (each keeps its own cadence): N paths cost N/interval small
        # wake-ups' worth of work, never N probes (and N replies, and N
        # answers at the peer) in one lump that stalls the loop.
        probers = list(self.probers.values())
        loop = self._loop = asyncio.get_running_loop()
        for rail in self.sockets.values():  # sockets first: opening them takes time
            rail.open(loop)
        self._set_send_slot()
        start, spacing = loop.time(), self.config.interval_s / max(1, len(probers))
        for i, prober in enumerate(probers):
            prober.start(start + i * spacing)

    def close(self) -> None:
        for prober in self.probers.values():
            prober.close()
        self.outbox.close()
        for rail in self.sockets.values():
            rail.close()
        self.timer.close()
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
            rail = prober.rail
            prober.close()
            if rail is not None and not rail.by_peer:  # the rail's last path
                rail.close()
                del self.sockets[(path.port, path.source)]
            self._assessed.pop(path, None)
            if self.on_change is not None:
                self.on_change(path, prober.assessment())  # the owner re-reads that port
        added = [p for p in wanted if p not in self.probers]
        for path in added:
            self.probers[path] = self._prober(path)
        self._set_send_slot()
        if self._started:
            for rail in self.sockets.values():
                rail.open(self._loop)
            for path in added:  # at a random phase: the others keep theirs
                self.probers[path].start(self._loop.time()
                                         + random.random() * self.config.interval_s)
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

    def batching(self) -> dict[str, int]:
        """Timer wake-ups, and the rails' system calls and datagrams (how well
        probes share wake-ups and calls; logged when the daemon stops)."""
        out = {"timer_wakeups": self.timer.wakeups, "timer_runs": self.timer.runs}
        for name in ("send_calls", "sent", "recv_calls", "received", "foreign"):
            out[name] = sum(getattr(rail, name) for rail in self.sockets.values())
        return out

    def responder_counters(self) -> ResponderCounters | None:
        """The responder's counters as the daemon reports them (None: no responder)."""
        if self.responder is None:
            return None
        c = self.responder.counters
        return ResponderCounters(answered=c.answered, refused_address=c.refused_address,
                                 refused_source=c.refused_source, rate_limited=c.rate_limited,
                                 malformed=c.malformed + c.ignored)

    def assessments(self, port: str | None = None) -> tuple[Assessment, ...]:
        """Each path's assessment as of its last verdict change, or of the
        last news from the peer's own probes (which way a one-way fault
        runs). Built once per such change: the daemon reads a rail's paths at
        every change of any of them, and rebuilding them all each time was
        O(paths) per change, O(paths²) for a rail blackhole."""
        out = []
        for path, prober in self.probers.items():
            if port is not None and path.port != port:
                continue
            known = self._assessed.get(path)
            if known is None:
                known = self._assessed[path] = prober.assessment()
            out.append(known)
        return tuple(out)

    def _changed(self, prober: EchoProber, assessment: Assessment) -> None:
        """A path's verdict changed: remember its assessment, tell the owner."""
        self._assessed[prober.path] = assessment
        if self.on_change is not None:
            self.on_change(prober.path, assessment)

    def _heard(self, heard: dict[tuple[str, str], float]) -> None:
        """The responder's batch: which peers' probes reached which of our addresses, when."""
        for pair, at in heard.items():
            prober = self._by_addresses.get(pair)
            if prober is not None and prober.sock is not None:
                prober.peer_heard(at)
                # The detail says which way a one-way fault runs: rebuild it.
                self._assessed.pop(prober.path, None)
